"""llama.cpp's extra buffer types (AMX, weight repacking): --repack auto turns them off where a
build with AMX/AVX512 kernels meets a CPU with AMX, the combination whose first decode segfaults
(issue 17); --no-repack / --repack on|off override. The detection reads llama.cpp's system info
and /proc/cpuinfo; here both are fake strings, since no machine this runs on has every CPU."""

from __future__ import annotations

import argparse

import llama_cpp
import pytest
from django.core.management.base import CommandError

from scheduler.engines.llama_cpp import (
    build_features,
    choose_repack,
    cpu_flags,
    extra_bufts_hazard,
)
from scheduler.management.options import (
    add_engine_arguments,
    engine_argv,
    scheduler_config,
)

# llama_print_system_info() of the portable AVX2 wheel (../shared/wheels) and of a native build
# on an AVX-512/AMX Xeon (what ggml-cpu.cpp's feature list prints there).
WHEEL_INFO = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
NATIVE_XEON_INFO = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
    "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
AVX512_ONLY_INFO = "CPU : AVX = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | REPACK = 1 | "
CUDA_INFO = "CUDA : ARCHS = 890 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : AVX2 = 1 | AMX_INT8 = 0 | REPACK = 1 | "


def cpuinfo(flags: str) -> str:
    block = f"processor\t: {{n}}\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\nflags\t\t: {flags}\nbugs\t\t: spectre_v1\n\n"
    return block.format(n=0) + block.format(n=1)


XEON_AMX = cpuinfo("fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8")
EPYC_AVX2 = cpuinfo("fpu sse sse2 avx avx2 fma bmi2 sha_ni")
XEON_AVX512 = cpuinfo("fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_vnni")


def test_system_info_and_cpu_flags_are_read_as_llama_cpp_and_linux_print_them() -> None:
    assert build_features(WHEEL_INFO) >= {"AVX2", "REPACK"} and "AVX512" not in build_features(WHEEL_INFO)
    assert build_features(NATIVE_XEON_INFO) >= {"AVX512", "AMX_INT8", "AVX512_VNNI"}
    assert "AMX_INT8" not in build_features(CUDA_INFO)  # "= 0" is off; "ARCHS = 890" is no feature
    assert cpu_flags(XEON_AMX) >= {"amx_tile", "amx_int8", "avx512f"}
    assert cpu_flags("") == set()


@pytest.mark.parametrize(
    ("info", "cpu", "on"),
    [
        (NATIVE_XEON_INFO, XEON_AMX, False),  # the machine: the README's native build on a Xeon with AMX
        (AVX512_ONLY_INFO, XEON_AMX, False),  # AVX-512 kernels on an AMX CPU: off as well
        (WHEEL_INFO, XEON_AMX, True),  # the portable wheel has neither kernel: nothing to turn off
        (WHEEL_INFO, EPYC_AVX2, True),  # the AVX2-only EPYC: repacking keeps its speed
        (AVX512_ONLY_INFO, XEON_AVX512, True),  # AVX-512 without AMX: no crash reported
        (NATIVE_XEON_INFO, "", True),  # no /proc/cpuinfo (not Linux): llama.cpp's default
    ],
)
def test_auto_turns_extra_buffer_types_off_only_where_amx_kernels_meet_an_amx_cpu(info: str, cpu: str, on: bool) -> None:
    use, note = choose_repack("auto", info, cpu)
    assert use is on
    assert (note is None) is on
    if note is not None:
        # one line: why, and how to override
        assert "\n" not in note and "AMX" in note and "--repack on" in note and "SUPERFLUID_REPACK=on" in note
        assert extra_bufts_hazard(info, cpu) is not None


def test_an_explicit_choice_wins_over_detection() -> None:
    assert choose_repack("on", NATIVE_XEON_INFO, XEON_AMX) == (True, None)
    assert choose_repack("off", WHEEL_INFO, EPYC_AVX2) == (False, None)
    with pytest.raises(ValueError, match="--repack"):
        choose_repack("yes", WHEEL_INFO, EPYC_AVX2)


def test_the_pinned_bindings_have_the_field_no_repack_sets() -> None:
    # what llama-server's --no-repack sets; a ctypes Structure would take a misspelt name silently
    assert ("use_extra_bufts", llama_cpp.ctypes.c_bool) in llama_cpp.llama_model_params._fields_


def parse(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return vars(parser.parse_args(argv))


def test_repack_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse()["repack"] == "auto"
    assert parse("--no-repack")["repack"] == "off"
    assert parse("--repack", "on")["repack"] == "on"
    assert parse("--repack", "on", "--no-repack")["repack"] == "off"  # the last one wins, as serve's retry relies on
    monkeypatch.setenv("SUPERFLUID_NO_REPACK", "1")
    assert parse()["repack"] == "off"
    assert parse("--repack", "on")["repack"] == "on"
    monkeypatch.delenv("SUPERFLUID_NO_REPACK")
    monkeypatch.setenv("SUPERFLUID_REPACK", "on")
    assert parse()["repack"] == "on"


def test_a_bad_repack_value_is_refused_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CommandError, match="--repack must be auto, on or off"):
        scheduler_config(parse("--repack", "maybe"))
    options = parse("--no-repack")
    argv = engine_argv(options, tmp_path / "m.gguf")
    assert argv[argv.index("--repack") + 1] == "off"  # serve hands it on to the worker


@pytest.mark.model
@pytest.mark.parametrize("repack", ["on", "off"])
def test_the_engine_loads_and_decodes_its_start_up_batch_either_way(repack: str) -> None:
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path

    with LlamaCppEngine(default_model_path(), n_lanes=2, lane_ctx=256, repack=repack) as engine:
        assert engine.repack is (repack == "on")
        engine.probe()
        engine.probe()  # the probe frees its lanes: a second one starts from position 0 again


@pytest.mark.model
def test_checkengine_decodes_and_prints_speed_or_dies_with_the_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The check CI runs against the from-source build: it says what it loaded and how fast it
    decodes, and fails when the engine cannot decode (here a simulated start-up crash)."""
    import os
    import subprocess
    import sys

    from testkit.harness import ROOT

    argv = [sys.executable, str(ROOT / "manage.py"), "checkengine", "--max-batch", "2", "--rounds", "2", "--no-repack"]
    env = {**os.environ, "SUPERFLUID_DATA_DIR": str(tmp_path)}
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "extra buffer types (AMX, weight repacking): off (--repack off)" in done.stdout
    assert "start-up decode: ok" in done.stdout
    assert "2 lane(s): prefill" in done.stdout and "decode" in done.stdout
    env["SUPERFLUID_TEST_CRASH_PROBE"] = "always"
    crashed = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert crashed.returncode == -11 and "start-up decode: ok" not in crashed.stdout
