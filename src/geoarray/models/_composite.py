"""A layer-contract model that delegates to a :class:`geoarray.nn.Chain` of existing layers."""

from __future__ import annotations

from typing import Any

from ..nn import Chain, Layer


def check_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int ≥ {minimum}, got {value!r}")
    return value


class ComposedModel(Layer):
    """Base of the dynamics models: ``self.chain`` does the work; ``params`` is the chain's tuple."""

    chain: Chain

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> Any:
        return self.chain.init(seed, xp=xp, dtype=dtype, device=device)

    def manifolds(self) -> Any:
        return self.chain.manifolds()

    def apply(self, params: Any, x: Any) -> Any:
        return self.chain.apply(params, x)

    def vjp(self, params: Any, x: Any) -> Any:
        return self.chain.vjp(params, x)
