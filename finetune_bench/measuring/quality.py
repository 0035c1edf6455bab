"""What a loss says about the model: perplexity from a mean cross entropy (no torch needed)."""

import math

# exp overflows a float above about 709.78.
_LARGEST_EXPONENT = 700.0


def perplexity(loss: float) -> float:
    """exp(mean cross entropy per token, in nats); infinite where exp would overflow."""
    return math.exp(loss) if loss < _LARGEST_EXPONENT else math.inf
