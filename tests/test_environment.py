"""`describe_cpu`: the processor and its kernel-deciding extensions in environment.json."""

from __future__ import annotations

from leakbench.core.environment import describe_cpu, describe_environment

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw amx_tile amx_bf16
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2
"""


def test_the_first_processor_s_model_and_kernel_flags_are_read() -> None:
    # The first processor's lines decide; only the listed extensions are kept, in their order.
    assert describe_cpu(CPUINFO) == {
        "cpu": "Intel(R) Xeon(R) Platinum 8480+",
        "cpu_flags": ["avx2", "avx512f", "amx_tile"],
    }


def test_no_model_line_gives_none_and_no_flags() -> None:
    assert describe_cpu("processor\t: 0\n") == {"cpu": None, "cpu_flags": []}


def test_environment_json_carries_the_processor() -> None:
    environment = describe_environment()
    assert "cpu" in environment and "cpu_flags" in environment
