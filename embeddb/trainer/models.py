"""Built-in dense models for jobs without Python (``model: builtin:NAME`` in the job YAML).

Every model is built by :func:`build_model` from the job's shapes and takes what a training
context passes (:meth:`~embeddb.trainer.ctx.TrainCtx.forward`)::

    forward(non_id, embeddings) -> logits (n, 1)
      non_id      [x_1 (n, w_1), x_2 (n, w_2), ...]   the non-ID (numeric) features, batch order
      embeddings  [e_1 (n, d_1), e_2 (n, d_2), ...]   pooled, one per ID feature, batch order

For a job with ids ``[user, item, city]`` (dim 8) and numeric ``[price, age]``::

    x = [price (n, 1), age (n, 1)]  --cat, BatchNorm-->  numerics (n, 2)
    e = [user (n, 8), item (n, 8), city (n, 8)]

    dnn     MLP(cat[numerics, user, item, city] (n, 26))                   hidden, dropout
    fm      linear(numerics) + linear(cat[e] (n, 24))                          (first order)
            + 1/2 sum_k((sum_f e_fk)^2 - sum_f e_fk^2)      (second order over the 3 features)
    deepfm  fm + dnn's MLP, on the same embeddings                             hidden, dropout
    dlrm    b = MLP_bottom(numerics) (n, 8);  T = [b, user, item, city] (n, 4, 8)
            top MLP(cat[b, (T T^t) upper triangle (n, 6)])                       bottom, top

``fm``, ``deepfm`` and ``dlrm`` need one embedding dim for every ID feature; ``dlrm`` without
numeric features has no bottom MLP (its top MLP reads the interactions and the embeddings).
Numeric features are batch-normalised (running statistics at inference). The models are
TorchScript-scriptable (:func:`embeddb.serving.export_model` scripts them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embeddb.errors import ConfigError
from embeddb.trainer.config import BUILTIN_MODELS

__all__ = ["BUILTIN_MODELS", "DLRM", "DNN", "FM", "DeepFM", "build_model"]


_DEFAULT_HIDDEN = (256, 128)
_DEFAULT_BOTTOM = (64,)


# ---------------------------------------------------------------------- parts
class _Numerics(nn.Module):
    """The non-ID features concatenated and batch-normalised: ``(n, sum(widths))``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(width)

    def forward(self, non_id: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(non_id, dim=1)
        if self.training and x.size(0) < 2:  # batch statistics of one row are undefined
            return F.batch_norm(
                x,
                self.norm.running_mean,
                self.norm.running_var,
                self.norm.weight,
                self.norm.bias,
                False,
                0.0,
                self.norm.eps,
            )
        normalised: torch.Tensor = self.norm(x)
        return normalised


def _mlp(width: int, hidden: Sequence[int], dropout: float, out: int | None) -> nn.Sequential:
    """Linear + ReLU (+ Dropout) per hidden width, then a final linear to ``out`` (if any)."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if dropout > 0.0:
            layers.append(nn.Dropout(dropout))
        width = h
    if out is not None:
        layers.append(nn.Linear(width, out))
    return nn.Sequential(*layers)


def _fm_second_order(stacked: torch.Tensor) -> torch.Tensor:
    """``(n, F, D)`` -> ``(n, 1)``: the sum over feature pairs of their dot products."""
    square_of_sum = stacked.sum(dim=1).pow(2)
    sum_of_squares = stacked.pow(2).sum(dim=1)
    return 0.5 * (square_of_sum - sum_of_squares).sum(dim=1, keepdim=True)


# ---------------------------------------------------------------------- models
class DNN(nn.Module):
    """An MLP over the batch-normalised numerics and every embedding, concatenated.

    Args:
        id_dims: the embedding dim of each ID feature, in batch order.
        non_id_widths: the width of each non-ID feature, in batch order.
        hidden: the hidden layers' widths.
        dropout: dropout after each hidden layer.
    """

    def __init__(
        self,
        id_dims: Sequence[int],
        non_id_widths: Sequence[int],
        hidden: Sequence[int] = _DEFAULT_HIDDEN,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        numeric = sum(non_id_widths)
        self.numerics = _Numerics(numeric) if numeric > 0 else None
        self.mlp = _mlp(numeric + sum(id_dims), hidden, dropout, 1)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        parts: list[torch.Tensor] = []
        if self.numerics is not None:
            parts.append(self.numerics(non_id))
        parts.extend(embeddings)
        return self.mlp(torch.cat(parts, dim=1))  # type: ignore[no-any-return]


class FM(nn.Module):
    """A factorization machine: first order (linear on the numerics and on the flattened
    embeddings) plus the bias-free second-order term over the ID features' embeddings.

    Args:
        id_dims: the embedding dim of each ID feature (all equal).
        non_id_widths: the width of each non-ID feature.
    """

    def __init__(self, id_dims: Sequence[int], non_id_widths: Sequence[int]) -> None:
        super().__init__()
        numeric = sum(non_id_widths)
        self.numerics = _Numerics(numeric) if numeric > 0 else None
        self.numeric_linear = nn.Linear(numeric, 1, bias=False) if numeric > 0 else None
        self.linear = nn.Linear(sum(id_dims), 1)  # its bias is the model's

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        return self._first_and_second_order(non_id, embeddings)[0]

    def _first_and_second_order(
        self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The FM logit, and the normalised numerics and flattened embeddings concatenated
        (the input of :class:`DeepFM`'s MLP)."""
        flat = torch.cat(embeddings, dim=1)
        logit: torch.Tensor = self.linear(flat) + _fm_second_order(torch.stack(embeddings, dim=1))
        if self.numerics is None or self.numeric_linear is None:
            return logit, flat
        numerics = self.numerics(non_id)
        return logit + self.numeric_linear(numerics), torch.cat([numerics, flat], dim=1)


class DeepFM(FM):
    """:class:`FM` plus an MLP (as :class:`DNN`) on the same embeddings and numerics, their
    logits summed.

    Args:
        id_dims: the embedding dim of each ID feature (all equal).
        non_id_widths: the width of each non-ID feature.
        hidden: the MLP's hidden widths.
        dropout: dropout after each hidden layer.
    """

    def __init__(
        self,
        id_dims: Sequence[int],
        non_id_widths: Sequence[int],
        hidden: Sequence[int] = _DEFAULT_HIDDEN,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(id_dims, non_id_widths)
        self.mlp = _mlp(sum(non_id_widths) + sum(id_dims), hidden, dropout, 1)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        logit, deep_input = self._first_and_second_order(non_id, embeddings)
        return logit + self.mlp(deep_input)  # type: ignore[no-any-return]


class DLRM(nn.Module):
    """DLRM: a bottom MLP maps the numerics to the embedding dim; the pairwise dot products of
    that vector and the embeddings (upper triangle) with the bottom output feed the top MLP.

    Args:
        id_dims: the embedding dim of each ID feature (all equal: ``D``).
        non_id_widths: the width of each non-ID feature; none: no bottom MLP, and the top MLP
            reads the interactions and the flattened embeddings.
        bottom: the bottom MLP's widths; a last layer of width ``D`` is added unless the list
            ends with ``D``.
        top: the top MLP's hidden widths (a final layer to the logit follows).
    """

    def __init__(
        self,
        id_dims: Sequence[int],
        non_id_widths: Sequence[int],
        bottom: Sequence[int] = _DEFAULT_BOTTOM,
        top: Sequence[int] = _DEFAULT_HIDDEN,
    ) -> None:
        super().__init__()
        dim = id_dims[0]
        numeric = sum(non_id_widths)
        widths = list(bottom) if list(bottom)[-1:] == [dim] else [*bottom, dim]
        self.numerics = _Numerics(numeric) if numeric > 0 else None
        self.bottom = _mlp(numeric, widths, 0.0, None) if numeric > 0 else None
        vectors = len(id_dims) + (1 if numeric > 0 else 0)
        pairs = vectors * (vectors - 1) // 2
        first = dim if numeric > 0 else sum(id_dims)
        self.top = _mlp(first + pairs, top, 0.0, 1)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        vectors: list[torch.Tensor] = []
        if self.numerics is not None and self.bottom is not None:
            dense = self.bottom(self.numerics(non_id))
            vectors.append(dense)
        else:
            dense = torch.cat(embeddings, dim=1)
        vectors.extend(embeddings)
        stacked = torch.stack(vectors, dim=1)  # (n, F, D)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))  # (n, F, F)
        pairs = torch.triu_indices(dots.size(1), dots.size(1), 1, device=dots.device)
        interactions = dots[:, pairs[0], pairs[1]]  # the upper triangle: (n, F (F - 1) / 2)
        return self.top(torch.cat([dense, interactions], dim=1))  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- building
def _positive_ints(key: str, value: object, accepted: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
    ):
        raise ConfigError(
            f"model_args.{key}",
            f"must be a list of positive integers, got {value!r} ({accepted})",
        )
    return tuple(int(v) for v in value)


def _dropout(key: str, value: object, accepted: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(
            f"model_args.{key}", f"must be a number in [0, 1), got {value!r} ({accepted})"
        )
    return float(value)


_Check = Callable[[str, object, str], object]
_ARGS: Mapping[str, Mapping[str, _Check]] = {
    "dnn": {"hidden": _positive_ints, "dropout": _dropout},
    "fm": {},
    "deepfm": {"hidden": _positive_ints, "dropout": _dropout},
    "dlrm": {"bottom": _positive_ints, "top": _positive_ints},
}
_CLASSES: Mapping[str, type[nn.Module]] = {"dnn": DNN, "fm": FM, "deepfm": DeepFM, "dlrm": DLRM}


def build_model(
    name: str, *, id_dims: Sequence[int], non_id_widths: Sequence[int], **model_args: Any
) -> nn.Module:
    """Build the built-in model ``name`` for a job's features (see the module docstring).

    Args:
        name: one of :data:`BUILTIN_MODELS` (a ``builtin:`` prefix is accepted).
        id_dims: the embedding dim of each ID feature, in the batch's order.
        non_id_widths: the width of each non-ID feature, in the batch's order.
        **model_args: the model's settings (the job's ``model_args``): ``dnn`` and ``deepfm``:
            ``hidden`` (default ``[256, 128]``), ``dropout`` (``0.0``); ``dlrm``: ``bottom``
            (``[64, D]``), ``top`` (``[256, 128]``); ``fm``: none.

    Returns:
        The model (``forward(non_id, embeddings) -> (n, 1)`` logits), in training mode.

    Raises:
        ConfigError: an unknown model (key ``model``), an unknown or invalid argument
            (``model_args.<key>``), no features (``model``), or embedding dims that differ
            where the model needs one dim (``embedding_dim``).
    """
    model = name.removeprefix("builtin:") if isinstance(name, str) else name
    if model not in _CLASSES:
        raise ConfigError("model", f"unknown builtin model {name!r} ({', '.join(BUILTIN_MODELS)})")
    dims = _sizes("model", id_dims, minimum=1)
    widths = _sizes("model", non_id_widths, minimum=0)
    checks = _ARGS[model]
    accepted = f"builtin:{model} accepts " + (", ".join(checks) if checks else "no model_args")
    kwargs: dict[str, Any] = {}
    for key, value in model_args.items():
        check = checks.get(key)
        if check is None:
            raise ConfigError(f"model_args.{key}", f"unknown argument ({accepted})")
        kwargs[key] = check(key, value, accepted)
    if not dims and (model != "dnn" or sum(widths) == 0):
        what = "ID or numeric feature" if model == "dnn" else "ID feature"
        raise ConfigError("model", f"builtin:{model} needs at least one {what}")
    if model != "dnn" and len(set(dims)) > 1:
        raise ConfigError(
            "embedding_dim",
            f"builtin:{model} needs one embedding dim for every ID feature, got {list(dims)}",
        )
    return _CLASSES[model](dims, widths, **kwargs)


def _sizes(key: str, values: Sequence[int], *, minimum: int) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(key, f"feature sizes must be integers, got {values!r}") from None
    if any(s < minimum for s in sizes):
        raise ConfigError(key, f"feature sizes must be at least {minimum}, got {list(sizes)}")
    return sizes
