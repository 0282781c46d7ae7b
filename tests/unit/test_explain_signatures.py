"""The signature table (vllm/data/log_signatures.json) and the bounded scanner, in process."""

from __future__ import annotations

import re

import pytest

from rocmdoctor.vllm.log_scan import ERROR_LINES, EVIDENCE_LINES, Scanner
from rocmdoctor.vllm.log_signatures import MAX_LINE_CHARS, match_line, message, signatures

TABLE = signatures()


@pytest.mark.parametrize("sig", TABLE, ids=[s.id for s in TABLE])
def test_each_signature_recognises_its_own_real_line_and_names_its_source(sig):
    found = match_line(sig.example)
    assert found is not None and found.signature.id == sig.id
    assert re.search(r"https://|\.(?:py|cpp|c|md|json)\b", sig.source), sig.source
    assert sig.summary and sig.remedy


def test_every_check_a_signature_names_is_registered_and_only_host_problems_have_checks():
    from rocmdoctor.checks import load_registry

    registered = {spec.id for spec in load_registry().specs}
    for sig in TABLE:
        assert set(sig.checks) <= registered, sig.id
        assert sig.host_problem or not sig.checks, sig.id
        # a remedy's `rocmdoctor check --only X` must name a check that exists
        assert set(re.findall(r"--only ([\w.]+)", sig.remedy)) <= registered, sig.remedy
    ids = {s.id for s in TABLE}
    # every cause the issue lists has a signature
    assert {
        "cwsr",
        "dkms-shadowing",
        "invalid-image",
        "broken-bundle",
        "device-permission",
        "free-memory-at-startup",
        "max-model-len",
        "out-of-memory",
        "oom-killer",
        "port-in-use",
        "orphaned-engine",
        "jit-toolchain",
        "mes-hang",
        "page-fault",
        "gpu-choice",
        "rccl-ipc",
        "python-shadowing",
        "hf-auth",
        "hsa-override",
    } <= ids


@pytest.mark.parametrize(
    "line, text",
    [
        ("Aug 08 22:35:13 host kernel: amdgpu 0000:c3:00.0: x", "amdgpu 0000:c3:00.0: x"),
        ("[312682.882414] amdgpu: y", "amdgpu: y"),
        ("(EngineCore_DP0 pid=742) ERROR 06-16 20:55:14 [core.py:1224] ValueError: z", "ValueError: z"),
        (
            "2026-05-08 11:50:25.741 [Error] (Process) (EngineCore pid=3043) INFO 05-08 11:50:25 [a.py:1] m",
            "m",
        ),
        ("\x1b[31mERROR:    [Errno 98] address already in use\x1b[0m", "[Errno 98] address already in use"),
        ("vllm-1  | RuntimeError: w", "RuntimeError: w"),
        ("\t2 | AMDSMI_STATUS_FILE_ERROR", "2 | AMDSMI_STATUS_FILE_ERROR"),
    ],
)
def test_loggers_prefixes_come_off_before_matching(line, text):
    assert message(line) == text


@pytest.mark.parametrize(
    "line",
    [
        # a word in a sentence is not the error: the keyword trap of peers (ROCm/rocm-cli PR #374)
        "INFO we fixed hipErrorInvalidImage last week by reinstalling",
        "Check whether /dev/kfd is readable: Unable to open it happens when ...",
        "the docs say: Your kernel should carry the CWSR fix",
        "(APIServer pid=1) INFO 05-05 12:36:59 [api_server.py:1] out of memory handling enabled",
    ],
)
def test_a_keyword_inside_a_sentence_is_not_a_cause(line):
    assert match_line(line) is None


@pytest.mark.parametrize(
    "line",
    [
        # modinfo amdgpu as posted in ROCm/legacy-rocm-build#1584, and modinfo -n (host-facts.md section 4)
        "filename:       /lib/modules/5.11.0-37-generic/updates/dkms/amdgpu.ko",
        "/lib/modules/6.17.0-1012-oem/updates/dkms/amdgpu.ko.zst",
    ],
)
def test_a_dkms_module_path_is_dkms_shadowing_and_the_in_tree_one_is_not(line):
    found = match_line(line)
    assert found is not None and found.signature.id == "dkms-shadowing"
    assert match_line(line.replace("updates/dkms", "kernel/drivers/gpu/drm/amd/amdgpu")) is None


def test_a_missing_libtorch_is_a_broken_bundle_not_a_permission_problem():
    found = match_line(
        "ImportError: libtorch_cuda.so: cannot open shared object file: No such file or directory"
    )
    assert found is not None and found.signature.id == "broken-bundle"


def test_the_root_cause_outranks_the_out_of_memory_that_follows_it():
    scanner = Scanner()
    scanner.feed(
        b"torch.OutOfMemoryError: HIP out of memory\nRuntimeError: HIP error: hipErrorInvalidImage\n"
    )
    scan = scanner.finish()
    order = [s.id for s in TABLE]
    first = min(scan.evidence, key=order.index)
    assert first == "invalid-image"


def test_evidence_and_error_lines_are_capped_and_numbered():
    scanner = Scanner()
    body = b"".join(b"OSError: [Errno 98] Address already in use\n" for _ in range(50))
    body += b"".join(b"RuntimeError: unknown thing %d\n" % i for i in range(50))
    scanner.feed(body)
    scan = scanner.finish()
    ev = scan.evidence["port-in-use"]
    assert ev.count == 50 and len(ev.lines) == EVIDENCE_LINES
    assert [line.number for line in ev.lines] == [1, 2, 3, 4, 5]
    errors = scan.error_like()
    assert len(errors) == ERROR_LINES and errors[-1].number == 100  # the last traceback line is kept


def test_a_line_without_end_and_binary_data_are_held_within_the_limit():
    scanner = Scanner()
    for _ in range(64):  # 64 MiB of NULs and noise without a newline
        scanner.feed(b"\x00\xff" * (512 * 1024))
        assert len(scanner._partial) <= MAX_LINE_CHARS * 4
    scanner.feed(b"\nOSError: [Errno 98] Address already in use\n")
    scan = scanner.finish()
    assert scan.overlong_lines == 1 and scan.binary_bytes == 32 * 1024 * 1024
    assert scan.evidence["port-in-use"].lines[0].number == 2


def test_after_a_skip_lines_carry_offsets_not_numbers():
    scanner = Scanner()
    scanner.feed(b"INFO a\nINFO b")
    scanner.skip(1000)
    scanner.feed(b"x\nOSError: [Errno 98] Address already in use\n")
    line = scanner.finish().evidence["port-in-use"].lines[0]
    assert line.number is None and line.offset == 13 + 1000 + 2
