from pydantic import Field

from genlm_core.engine import BackendConfig


class MockConfig(BackendConfig):
    """Options of the mock backend. ``model=None`` uses the built-in byte-level vocabulary;
    a model folder lends only its tokenizer."""

    component = "mock"

    scale: float = Field(1.0, gt=0, description="logits are uniform in [0, scale): larger is peakier")
    max_context_length: int | None = Field(None, ge=1, description="longest context accepted")
    work_s: float = Field(0.0, ge=0, description="seconds each forward pass sleeps (simulates a model)")

    def model_needs(self) -> tuple[str, ...]:
        return ("tokenizer",)
