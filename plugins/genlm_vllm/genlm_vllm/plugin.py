"""Hook implementations of genlm-vllm. Imports nothing heavy (no torch, no vllm)."""

from genlm_core import hookimpl


@hookimpl
def genlm_register_backends(register):
    register(
        "vllm",
        "genlm_vllm.engine:VLLMEngine",
        config="genlm_vllm.config:VLLMConfig",
        devices=["cuda", "cpu"],
        # never auto-picked on a CPU-only machine over hf; first choice on a GPU
        priority={"cuda": 100, "cpu": -10},
        requires=["vllm"],
        install='pip install "genlm-vllm[cuda]"  (CPU machines: pip install "genlm-vllm[cpu]")',
        description="vLLM V1 engine: batched full next-token logprobs via a logits processor",
        model_formats=["hf-folder", "hub-id"],
    )


@hookimpl
def genlm_doctor(hardware):
    from genlm_vllm.doctor import doctor_section

    return doctor_section(hardware)
