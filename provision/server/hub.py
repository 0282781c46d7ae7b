"""A model's config.json and safetensors headers from the Hugging Face Hub, by HTTP range requests.

Endpoints (huggingface_hub's own): `GET {endpoint}/api/models/{id}/revision/{rev}` lists the files;
`GET {endpoint}/{id}/resolve/{rev}/{file}` serves one (redirecting to a CDN for large files), with
`Range: bytes=a-b` honoured. Per shard we ask for bytes 0-7 (the header length N), then 8..8+N-1:
the header and never a weight byte. A server that ignores Range is read only up to what we asked.
Every request shares one total deadline; every body is capped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import msgspec
from msgspec import Meta

from rocmdoctor import documents
from rocmdoctor.host_files import lexists
from rocmdoctor.provision import bounded_http
from rocmdoctor.sensitive import KeyFileError, check_token, read_api_key
from rocmdoctor.vllm.model_files import (
    CONFIG_FILE,
    INDEX_FILE,
    MAX_CONFIG_BYTES,
    MAX_INDEX_BYTES,
    ModelFiles,
    ModelFilesError,
    check_revision,
    decode_config,
    header_length,
    looks_like_hub_id,
    parse_header,
    shard_names,
)

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_DEADLINE_S = 60.0
MAX_LISTING_BYTES = 16 << 20
MAX_FILES = 100_000


class HubError(ModelFilesError):
    """The Hub could not give us the files; the message says why and what to do."""


class Sibling(msgspec.Struct, forbid_unknown_fields=False):
    rfilename: Annotated[str, Meta(max_length=1024)]


class ModelInfo(msgspec.Struct, forbid_unknown_fields=False):
    """GET /api/models/{id}/revision/{rev}: only the file list is used."""

    siblings: Annotated[list[Sibling], Meta(max_length=MAX_FILES)] = []


def hub_token(env: Mapping[str, str] = os.environ) -> str | None:
    """The user's token the way huggingface_hub finds it: HF_TOKEN, then the token file (read under the
    key-file rule: a regular file, no link followed, ours or root's, bounded). A malformed token is
    HubError without its text."""
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if env.get(key, "").strip():
            try:
                return check_token(env[key].strip(), key)
            except KeyFileError as exc:
                raise HubError(f"{exc}; fix {key} or unset it") from None
    path = env.get("HF_TOKEN_PATH") or str(
        Path(env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
        / "token"
    )
    token_file = Path(path).expanduser()
    if not lexists(token_file):
        return None
    try:
        return read_api_key(token_file, where=f"the Hugging Face token file {token_file}")
    except KeyFileError as exc:
        raise HubError(f"{exc}; or log in again (`huggingface-cli login`)") from None


class HubClient:
    def __init__(
        self,
        model_id: str,
        revision: str = "main",
        *,
        endpoint: str | None = None,
        token: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
        session=None,
    ) -> None:
        if not looks_like_hub_id(model_id):
            raise HubError(f"{model_id!r} is not a Hugging Face model id (org/name)")
        self.model_id = model_id
        self.revision = check_revision(revision)
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.token = token
        self.deadline = bounded_http.Deadline(deadline_s)
        self.session = session or bounded_http.new_session()
        self.bytes_read = 0

    def _url(self, filename: str) -> str:
        return f"{self.endpoint}/{self.model_id}/resolve/{quote(self.revision, safe='')}/{quote(filename)}"

    def _get(self, url: str, what: str, limit: int, byte_range: tuple[int, int] | None = None) -> bytes:
        headers = {"User-Agent": "rocmdoctor-plan"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            answer = bounded_http.get(
                url,
                deadline=self.deadline,
                limit=limit,
                headers=headers,
                session=self.session,
                byte_range=byte_range,
                connect_s=10.0,
                read_s=10.0,
            )
        except bounded_http.HttpTimeout:
            raise HubError(
                f"the Hub did not send {what} within {self.deadline.seconds:g} s (its deadline); retry, "
                "or use a local directory / the cache (--offline)"
            ) from None
        except bounded_http.HttpError as exc:
            raise HubError(f"cannot fetch {what} from {self.endpoint}: {exc}") from None
        self._raise_for(answer.status, what)
        self.bytes_read += len(answer.body)
        if byte_range is None and len(answer.body) > limit:
            raise HubError(f"{what} is larger than {limit} bytes; refusing to read it")
        return answer.body[:limit]

    def _raise_for(self, status: int, what: str) -> None:
        if status in (200, 206):
            return
        page = f"{self.endpoint}/{self.model_id}"
        if status in (401, 403):
            how = (
                "your token (HF_TOKEN or `huggingface-cli login`) was refused: it may lack access"
                if self.token
                else "no token was sent: set HF_TOKEN or run `huggingface-cli login`"
            )
            raise HubError(
                f"{self.model_id} is gated or private (HTTP {status} for {what}): accept its license at "
                f"{page} and make sure {how}"
            )
        if status == 404:
            raise HubError(
                f"{what} not found on the Hub (HTTP 404): check the model id {self.model_id!r} "
                f"and --revision {self.revision!r}"
            )
        raise HubError(f"the Hub answered HTTP {status} for {what}")

    def listing(self) -> list[str]:
        url = f"{self.endpoint}/api/models/{self.model_id}/revision/{quote(self.revision, safe='')}"
        body = self._get(url, f"the file list of {self.model_id}", MAX_LISTING_BYTES)
        try:
            info = documents.decode(
                body, ModelInfo, f"the Hub's file list of {self.model_id}", MAX_LISTING_BYTES
            )
        except documents.DocumentError as exc:
            raise HubError(f"{exc}; is HF_ENDPOINT a Hugging Face Hub?") from None
        return [s.rfilename for s in info.siblings]

    def file(self, filename: str, limit: int) -> bytes:
        return self._get(self._url(filename), filename, limit)

    def header(self, filename: str):
        url = self._url(filename)
        first = self._get(url, f"{filename} (header length)", 8, (0, 7))
        length = header_length(first, filename)
        blob = self._get(url, f"{filename} (header)", length, (8, 8 + length - 1))
        if len(blob) != length:
            raise HubError(f"{filename}: the Hub sent {len(blob)} header bytes of {length}")
        return parse_header(blob, filename)


def fetch_model(
    model_id: str,
    revision: str = "main",
    *,
    endpoint: str | None = None,
    env: Mapping[str, str] = os.environ,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> ModelFiles:
    """config.json and every shard's safetensors header of `model_id`, from the Hub."""
    client = HubClient(model_id, revision, endpoint=endpoint, token=hub_token(env), deadline_s=deadline_s)
    names = client.listing()
    if CONFIG_FILE not in names:
        raise HubError(
            f"{model_id} has no config.json on the Hub (revision {revision!r}); not a transformers model"
        )
    config = decode_config(client.file(CONFIG_FILE, MAX_CONFIG_BYTES), f"{model_id}: {CONFIG_FILE}")
    files = ModelFiles("Hugging Face Hub", f"{client.endpoint}/{model_id}", config)
    if INDEX_FILE in names:
        shards = shard_names(client.file(INDEX_FILE, MAX_INDEX_BYTES), f"{model_id}: {INDEX_FILE}")
    else:
        shards = sorted(n for n in names if n.endswith(".safetensors") and "/" not in n)
    if not shards:
        files.weights_note = f"{model_id} has no safetensors weights on the Hub: the weights' size is unknown"
    for shard in shards:
        files.headers.append(client.header(shard))
    files.bytes_read = client.bytes_read
    return files


def load_model(
    model: str,
    revision: str = "main",
    *,
    offline: bool = False,
    env: Mapping[str, str] = os.environ,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> ModelFiles:
    """A local directory, else the Hugging Face cache, else (unless `offline`) the Hub."""
    from rocmdoctor.vllm.model_files import local_model

    files = local_model(model, revision, env)
    if files is not None:
        return files
    if offline:
        raise HubError(
            f"{model} is not in the Hugging Face cache and --offline forbids the Hub; download it "
            f"(huggingface-cli download {model} config.json) or drop --offline"
        )
    return fetch_model(model, revision, env=env, deadline_s=deadline_s)
