"""`check --textfile` when what becomes a label is not UTF-8: the current bundle's tag is the name its
`current` link points to, bytes on disk that a replayed or live root may hold in any encoding (read
through surrogateescape). The file is still written, valid Prometheus text, the label escaped."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from harness.hosts import fixture_root
from rocmdoctor.cli import cli


def test_a_bundle_tag_that_is_not_utf8_is_escaped_and_the_file_written(tmp_path: Path):
    root = tmp_path / "root"
    shutil.copytree(fixture_root("strix-halo-clean"), root, symlinks=True)
    prefix = os.fsencode(root / "opt/rocmdoctor")
    tag = b"vllm0.20.1-rocm7.12.0-gfx1151-\xff\xfe"
    os.makedirs(prefix + b"/bundles/" + tag)
    with open(prefix + b"/bundles/" + tag + b"/.rocmdoctor-bundle.json", "wb") as f:
        f.write(b'{"family": "gfx1151", "tag": "\\udc80"}')
    os.symlink(b"bundles/" + tag, prefix + b"/current")
    out = tmp_path / "textfile" / "rocmdoctor.prom"
    out.parent.mkdir()
    done = CliRunner().invoke(cli, ["--root", str(root), "check", "--textfile", str(out)])
    assert done.exit_code in (0, 1), done.output
    text = out.read_text(encoding="utf-8")
    info = {f.name: f.samples for f in text_string_to_metric_families(text)}["rocmdoctor_bundle_info"]
    assert info[0].labels["tag"] == "vllm0.20.1-rocm7.12.0-gfx1151-\\udcff\\udcfe"
