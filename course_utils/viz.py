"""Pictures the lessons share: training curves with their threshold, and a token viewer.

- ``plot_curves``: one metric per step for several runs, with a reference line (e.g. the clip
  threshold), so "which run crosses the line" is visible at a glance.
- ``token_viewer``: the tokens of a sequence as coloured boxes, coloured by a 0/1 mask (which
  tokens carry loss, which are attended) with chosen tokens outlined (e.g. ``<|im_end|>``).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from . import validate


def plot_curves(runs: dict[str, list[dict]], key: str = "loss", *, threshold: float | None = None,
                threshold_label: str = "threshold", title: str | None = None, ylabel: str | None = None,
                logy: bool = False, ax=None):
    """Plot ``record[key]`` per step for each named run (``train()`` records); returns the axes."""
    import matplotlib.pyplot as plt

    if not isinstance(runs, dict) or not runs:
        raise ValueError("plot_curves got no runs — it draws one line per run — pass "
                         "{'label': records, ...} with records from train().")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    for label, records in runs.items():
        if not records or key not in records[0]:
            raise ValueError(f"run {label!r} has no {key!r} in its records — the plot reads that field "
                             f"— pass a key that train() records, e.g. 'loss' or 'grad_norm'.")
        ax.plot([r["step"] for r in records], [r[key] for r in records], label=label, lw=1.5)
    if threshold is not None:
        ax.axhline(threshold, color="k", ls="--", lw=1, label=threshold_label)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel or key)
    ax.set_title(title or key)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


_STYLE = ("font-family:monospace;font-size:12px;line-height:2.1;white-space:pre-wrap;"
          "border:1px solid #ddd;padding:6px;border-radius:4px")


def _box(text: str, on: bool, outlined: bool) -> str:
    colour = "#b7e4c7" if on else "#eeeeee"
    outline = "outline:2px solid #d62828;" if outlined else ""
    return (f'<span style="background:{colour};{outline}padding:1px 2px;margin:1px;'
            f'border-radius:3px">{html.escape(text)}</span>')


def token_strings(tokenizer, input_ids: Iterable[int]) -> list[str]:
    """Each token as readable text: byte-level ``Ġ``/``Ċ`` shown as space and ``\\n``."""
    validate.tokenizer("tokenizer", tokenizer)
    if isinstance(input_ids, (str, bytes)) or not hasattr(input_ids, "__iter__"):
        raise TypeError(f"input_ids must be a sequence of token ids, got {type(input_ids).__name__} — one id "
                        "per token — pass e.g. example['input_ids'].")
    return [tokenizer.convert_tokens_to_string([t]).replace("\n", "\\n")
            for t in tokenizer.convert_ids_to_tokens(list(input_ids))]


def token_viewer(tokenizer, input_ids: Sequence[int], mask: Sequence[int], *,
                 highlight: Iterable[str] = ("<|im_end|>",), legend: str = "carries loss"):
    """An HTML view of a sequence: green tokens have ``mask == 1``, outlined ones are ``highlight``.

    Pass ``labels`` as the mask (``-100`` counts as 0) to see what is trained; pass an
    ``attention_mask`` to see what is attended.
    """
    from IPython.display import HTML

    validate.tokenizer("tokenizer", tokenizer)
    for name, seq in (("input_ids", input_ids), ("mask", mask)):
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
            raise TypeError(f"{name} must be a sequence of ints, got {type(seq).__name__} — one value per "
                            "token — pass e.g. example['input_ids'] and example['labels'].")
    input_ids, mask = list(map(int, input_ids)), [int(m) for m in mask]
    if len(input_ids) != len(mask):
        raise ValueError(f"token_viewer got {len(input_ids)} ids but {len(mask)} mask values — each "
                         "token needs one mask value — pass the ids and mask of the same sequence.")
    # labels (any -100, or values beyond 0/1) mark by "!= -100": a label can be token id 0 (<|endoftext|>)
    is_labels = any(m == -100 or m > 1 for m in mask)
    on = [m != -100 if is_labels else m != 0 for m in mask]
    highlight = set(highlight)
    tokens = tokenizer.convert_ids_to_tokens(input_ids)
    boxes = "".join(_box(text, flag, tok in highlight)
                    for text, flag, tok in zip(token_strings(tokenizer, input_ids), on, tokens))
    key = (f'<div style="font-size:11px;color:#555">{_box("green", True, False)} {legend} · '
           f'{_box("grey", False, False)} not · {_box("outlined", False, True)} '
           f'{", ".join(sorted(highlight)) or "highlighted"} · {sum(on)}/{len(on)} tokens</div>')
    return HTML(f'<div style="{_STYLE}">{boxes}</div>{key}')
