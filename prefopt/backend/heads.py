"""Scalar heads on a transformer trunk (reward and value models) and a per-token value table."""

from __future__ import annotations

import math

import torch
from torch import nn


def _config_width(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    for attr in ("hidden_size", "n_embd", "d_model"):  # the name varies by architecture
        if width := getattr(config, attr, None):
            return int(width)
    raise ValueError(f"Cannot read the hidden size of {type(model).__name__}.")


@torch.no_grad()
def trunk_width(backbone: nn.Module) -> int:
    """Width of the last hidden state a trunk returns, measured on one token.

    The config's ``hidden_size`` is not always that width: OPT projects its last
    hidden state to ``word_embed_proj_dim`` (``project_out``). One forward pass of
    one token, in eval mode and without gradients, measures the very tensor a head
    multiplies, for any trunk; it draws no random numbers, so seeded runs are
    unchanged. A module without weights (nothing to run on) is read from its config.

    Parameters
    ----------
    backbone : nn.Module
        A Hugging Face base model returning ``last_hidden_state``.

    Returns
    -------
    width : int

    Examples
    --------
    >>> from transformers import OPTConfig, OPTModel
    >>> trunk = OPTModel(OPTConfig(vocab_size=11, hidden_size=16, word_embed_proj_dim=8,
    ...     ffn_dim=32, num_hidden_layers=1, num_attention_heads=2))
    >>> trunk.config.hidden_size, trunk_width(trunk)
    (16, 8)
    """
    weight = next(backbone.parameters(), None)
    if weight is None:
        return _config_width(backbone)
    training = backbone.training
    backbone.eval()
    try:
        ids = torch.zeros((1, 1), dtype=torch.long, device=weight.device)
        out = backbone(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        backbone.train(training)
    return int(out.last_hidden_state.shape[-1])


class ScalarHeadModel(nn.Module):
    """A transformer trunk with a linear head giving one scalar per position.

    Used for the reward model and the value model. The head's weights are drawn
    from N(0, std = 1/sqrt(d_model + 1)) and its bias is 0, as in the original
    code of Ziegler et al. 2019 (Huang et al. 2024; the paper misprints the std).
    ``d_model`` is the width of the trunk's last hidden state, measured by
    :func:`trunk_width` (OPT's ``word_embed_proj_dim``, not its ``hidden_size``).

    Parameters
    ----------
    backbone : nn.Module
        A Hugging Face base model (``AutoModel``) returning ``last_hidden_state``.
    head_std : float, default=None
        Standard deviation of the head's weights; ``None`` means
        ``1/sqrt(d_model + 1)``.
    generator : torch.Generator, default=None
        Generator for the head's initial weights.

    Examples
    --------
    >>> from transformers import GPT2Config, GPT2Model
    >>> import torch
    >>> trunk = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=11))
    >>> head = ScalarHeadModel(trunk)
    >>> head(torch.zeros(2, 3, dtype=torch.long)).shape
    torch.Size([2, 3])
    """

    def __init__(
        self,
        backbone: nn.Module,
        head_std: float | None = None,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        self.backbone = backbone
        d_model = trunk_width(backbone)
        # Built without nn.Linear's own initialisation, which draws from torch's global
        # generator: the weights come from ``generator`` alone (a zero head draws nothing).
        self.head = nn.utils.skip_init(nn.Linear, d_model, 1)
        std = 1.0 / math.sqrt(d_model + 1) if head_std is None else head_std
        with torch.no_grad():
            if std == 0:
                self.head.weight.zero_()
            else:
                weight = torch.randn(self.head.weight.shape, generator=generator) * std
                self.head.weight.copy_(weight)
            self.head.bias.zero_()

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        """One scalar per position: the head applied to the trunk's last hidden state.

        Parameters
        ----------
        input_ids : torch.Tensor of shape (n, width)
        attention_mask : torch.Tensor of shape (n, width), default=None
        position_ids : torch.Tensor of shape (n, width), default=None
        **kwargs
            Ignored (the callers' other forward arguments).

        Returns
        -------
        values : torch.Tensor of shape (n, width)
        """
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )
        hidden = out.last_hidden_state
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)


class TokenValueTable(nn.Module):
    """A value model that is one learned number per input token.

    For one-step responses, the value at the last prompt position is a learned
    per-prompt baseline; this is the value model PPO uses when the policy is not
    a transformer it can copy a trunk from (e.g. the preference world's policy).

    Parameters
    ----------
    vocab_size : int
        Number of token ids.

    Examples
    --------
    >>> import torch
    >>> TokenValueTable(5)(torch.tensor([[1, 2]])).shape
    torch.Size([1, 2])
    """

    def __init__(self, vocab_size: int):
        super().__init__()
        self.values = nn.Embedding(vocab_size, 1)
        nn.init.zeros_(self.values.weight)

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        """The learned value of each input token.

        Parameters
        ----------
        input_ids : torch.Tensor of shape (n, width)
        attention_mask : torch.Tensor of shape (n, width), default=None
            Ignored: each position's value depends on its own token only.
        position_ids : torch.Tensor of shape (n, width), default=None
            Ignored.
        **kwargs
            Ignored.

        Returns
        -------
        values : torch.Tensor of shape (n, width)
        """
        return self.values(input_ids).squeeze(-1)


def shared_value_model(model):
    """A zero-initialised value head on the policy's own trunk (no copy of the weights).

    The original code's shared network (Ziegler et al. 2019): the value loss then
    also trains the trunk.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers causal LM (or a peft model around one).

    Returns
    -------
    value_model : ScalarHeadModel
    """
    base = getattr(model, "get_base_model", lambda: model)()
    trunk = getattr(base, "base_model", None)
    if trunk is None or trunk is base or not hasattr(trunk, "config"):
        raise ValueError("value_model='shared' needs a transformers policy with a base model.")
    return ScalarHeadModel(trunk, head_std=0.0)
