"""Pictures the lessons share: training curves with their threshold, and a token viewer.

- ``plot_curves``: one metric per step for several runs, with a reference line (e.g. the clip
  threshold), so "which run crosses the line" is visible at a glance.
- ``token_viewer``: the tokens of a sequence as coloured boxes, coloured by a 0/1 mask (which
  tokens carry loss, which are attended) with chosen tokens outlined (e.g. ``<|im_end|>``).
- ``what_if``: one slider per knob of a lesson (batch size, threshold, padding side, ``max_length``,
  learning rate...); each move redraws the lesson's own picture or table in place. Every lesson has one.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Iterable, Sequence

from . import validate
from .data import is_graded


def plot_curves(runs: dict[str, list[dict]], key: str = "loss", *, threshold: float | None = None,
                threshold_label: str = "threshold", title: str | None = None, ylabel: str | None = None,
                logy: bool = False, ax=None):
    """Plot ``record[key]`` per step for each named run (``train()`` records); returns the axes."""
    import matplotlib.pyplot as plt

    if not isinstance(runs, dict) or not runs:
        raise ValueError("plot_curves got no runs — it draws one line per run — pass "
                         "{'label': records, ...} with records from train().")
    validate.non_empty_string("key", key, why="it names the field of each record to plot")
    validate.number("threshold", threshold, allow_none=True, why="it is drawn as a horizontal line")
    validate.non_empty_string("threshold_label", threshold_label, why="it names the line in the legend")
    for name, text in (("title", title), ("ylabel", ylabel)):
        if text is not None:
            validate.non_empty_string(name, text, why="it labels the plot (None: the key)")
    validate.flag("logy", logy, why="it switches the logarithmic y axis")
    for label, records in runs.items():
        if (not isinstance(records, (list, tuple)) or not records
                or not all(isinstance(r, dict) for r in records)):
            raise ValueError(f"run {label!r} is not a non-empty list of records — the plot draws one point "
                             "per record — pass train()'s records (one dict per step).")
        if key not in records[0]:
            raise ValueError(f"run {label!r} has no {key!r} in its records — the plot reads that field "
                             f"— pass a key that train() records, e.g. 'loss' or 'grad_norm'.")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    for label, records in runs.items():
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
    input_ids = input_ids.tolist() if hasattr(input_ids, "tolist") else list(input_ids)
    if not input_ids or not all(isinstance(i, int) for i in input_ids):
        raise ValueError(f"input_ids must be a non-empty flat list of token ids, got {input_ids!r:.60} — one "
                         "id per token of one example — pass example['input_ids'] (one row, not a batch).")
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
    input_ids = validate.token_ids("input_ids", input_ids)
    mask = _mask_values(mask)
    highlight = validate.strings("highlight", highlight, allow_empty=True)
    validate.non_empty_string("legend", legend, why="it names what the green tokens are")
    if len(input_ids) != len(mask):
        raise ValueError(f"token_viewer got {len(input_ids)} ids but {len(mask)} mask values — each "
                         "token needs one mask value — pass the ids and mask of the same sequence.")
    # labels (any -100, or values beyond 0/1) mark by "!= -100": a label can be token id 0 (<|endoftext|>)
    is_labels = any(not is_graded(m) or m > 1 for m in mask)
    on = [is_graded(m) if is_labels else m != 0 for m in mask]
    highlight = set(highlight)
    tokens = tokenizer.convert_ids_to_tokens(input_ids)
    boxes = "".join(_box(text, flag, tok in highlight)
                    for text, flag, tok in zip(token_strings(tokenizer, input_ids), on, tokens))
    key = (f'<div style="font-size:11px;color:#555">{_box("green", True, False)} {legend} · '
           f'{_box("grey", False, False)} not · {_box("outlined", False, True)} '
           f'{", ".join(sorted(highlight)) or "highlighted"} · {sum(on)}/{len(on)} tokens</div>')
    return HTML(f'<div style="{_STYLE}">{boxes}</div>{key}')


def _mask_values(mask) -> list[int]:
    """A mask as ints, one per token: 0/1 (an attention or assistant mask, booleans too) or labels (token
    ids and -100)."""
    if hasattr(mask, "tolist") and not isinstance(mask, (list, tuple)):  # a tensor or an array
        if getattr(mask, "ndim", 1) != 1:
            raise ValueError(f"mask has {mask.ndim} dimensions — one value per token of one example — pass "
                             "one row, e.g. batch['labels'][0].")
        mask = mask.tolist()
    if isinstance(mask, (str, bytes)) or not isinstance(mask, Sequence):
        raise TypeError(f"mask must be a sequence of ints, got {type(mask).__name__} — one value per token — "
                        "pass e.g. example['labels'] or example['attention_mask'].")
    values = []
    for m in mask:
        if not isinstance(m, bool) and not hasattr(m, "__index__"):
            raise TypeError(f"mask holds {m!r:.30} ({type(m).__name__}), not an integer — a mask value is "
                            "0/1, or a label (a token id, or -100) — pass e.g. example['labels'].")
        values.append(int(m))
    return values


# ------------------------------------------------------------------------------------------------
# "What if": a lesson's knob on a slider
# ------------------------------------------------------------------------------------------------

def figure(width: float = 7, height: float = 3.3):
    """A matplotlib Figure with one axes, made without pyplot: ``(fig, ax)``.

    Frames of a ``what_if`` control are drawn this way, so moving a slider never touches pyplot's
    global "current figure" (nor leaves figures open for the notebook to show twice).
    """
    from matplotlib.figure import Figure

    validate.number("width", width, positive=True, why="it is the figure's width in inches")
    validate.number("height", height, positive=True, why="it is the figure's height in inches")
    fig = Figure(figsize=(width, height), dpi=90)
    return fig, fig.add_subplot()


def _frame_parts(shown) -> tuple[str, list]:
    """Split what a frame function returned into (text, figures)."""
    parts = shown if isinstance(shown, tuple) else (shown,)
    texts = [p for p in parts if isinstance(p, str)]
    figures = [p for p in parts if hasattr(p, "savefig")]
    if len(texts) + len(figures) != len(parts) or not parts:
        kinds = ", ".join(type(p).__name__ for p in parts) or "nothing"
        raise TypeError(f"a what_if frame returned {kinds} — the control can show text and matplotlib "
                        "figures only — return a str, a Figure (viz.figure()), or a tuple of them.")
    return "\n".join(texts), figures


def _frame_html(text: str, figures: list) -> str:
    """Text as preformatted lines, each figure as an ``<img>`` whose alt text is its first title."""
    import base64
    import io

    pieces = [f'<pre style="margin:4px 0">{html.escape(text)}</pre>'] if text else []
    for fig in figures:
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        title = html.escape(next((ax.get_title() for ax in fig.axes if ax.get_title()), "figure"))
        pieces.append(f'<img src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}" '
                      f'alt="{title}" title="{title}">')
    return "".join(pieces)


def _options(name: str, options) -> tuple[list, dict]:
    """Slider options and the map back to values: a dict's keys are labels (values may be None)."""
    if isinstance(options, dict):
        labels, values = [str(k) for k in options], dict(zip(map(str, options), options.values()))
    elif isinstance(options, (list, tuple, range)):
        labels, values = list(options), None
    else:
        raise TypeError(f"what_if's {name!r} is a {type(options).__name__} — a slider needs a list of "
                        f"choices — pass a list, or a dict {{label: value}} (e.g. {{'off': None}}).")
    if not labels:
        raise ValueError(f"what_if's {name!r} has no choices — a slider needs at least one — pass a "
                         "non-empty list or dict.")
    return labels, values


def _is_scale(labels) -> bool:
    """Numbers (and "off", no value) sit on a slider; names of set-ups read better in a dropdown."""
    def number(label) -> bool:
        try:
            float(label)
            return not isinstance(label, bool)
        except (TypeError, ValueError):
            return label == "off"
    return all(number(label) for label in labels)


def what_if(frame, controls: dict, *, start: dict | None = None, descriptions: dict | None = None,
            width: str = "440px"):
    """A "what if" control: one slider per knob in ``controls``; each move redraws ``frame(**choice)``.

    A knob whose choices are numbers (or "off") is a slider; one of named set-ups is a dropdown.

    ``controls`` maps each keyword of ``frame`` to its choices (a list, or ``{label: value}`` where a
    value such as ``None`` cannot sit on a slider); ``start`` gives starting values (default: each
    first choice); ``descriptions`` longer slider names. ``frame`` returns a str, a matplotlib Figure or a
    tuple of them. Frames are cached, so going back is instant; the whole frame is one HTML value, so
    quick successive moves always end on the last setting. Without a widget frontend (nbval, a static
    render of the notebook) the control's plain text is the starting frame's text: the cell still
    prints the default answer.
    """
    import ipywidgets as widgets

    if not callable(frame):
        raise TypeError(f"what_if's frame is a {type(frame).__name__} — it draws one setting — pass a "
                        "function of the knobs, e.g. lambda batch_size: ...")
    if not isinstance(controls, dict) or not controls:
        raise ValueError("what_if got no controls — each is a slider — pass {'knob': [choices], ...}.")
    _check_knobs(frame, controls)
    validate.non_empty_string("width", width, why="it is the sliders' CSS width, e.g. '440px'")
    start = dict(start or {})
    room = {"style": {"description_width": "initial"}, "layout": widgets.Layout(width=width)}
    sliders, maps = {}, {}
    for name, options in controls.items():
        labels, maps[name] = _options(name, options)
        value = start.pop(name, labels[0] if maps[name] is None else None)
        if maps[name] is not None:  # start is given as a value; the slider holds its label
            value = next((lab for lab, v in maps[name].items() if v == value), labels[0])
        if value not in labels:
            raise ValueError(f"what_if's start for {name!r} is {value!r}, not one of its choices {labels} "
                             "— the slider must begin on a choice — pick one of them.")
        label = (descriptions or {}).get(name, name)
        kind = widgets.SelectionSlider if _is_scale(labels) else widgets.Dropdown
        sliders[name] = kind(options=labels, value=value, description=label, **room)
    if start:
        raise ValueError(f"what_if's start names {sorted(start)}, which are not controls "
                         f"{sorted(controls)} — pass start values for the controls only.")
    return _what_if_class()(frame, sliders, maps)


def _check_knobs(frame, controls: dict) -> None:
    """Each control is a keyword ``frame`` takes, and ``frame`` needs no other (it is called with the
    controls only)."""
    import inspect

    try:
        params = inspect.signature(frame).parameters
    except (TypeError, ValueError):  # a callable without a signature: nothing to compare
        return
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [n for n in controls if n not in known]
    if unknown:
        raise ValueError(f"what_if's controls {unknown} are not keywords of the frame (it takes {known})"
                         f"{_did_you_mean(unknown[0], known)} — each move calls frame(**setting), "
                         "so the first draw would fail — name the controls after the frame's arguments.")
    needed = [n for n in known if params[n].default is params[n].empty and n not in controls]
    if needed:
        raise ValueError(f"the frame needs {needed}, which no control gives — each move calls "
                         "frame(**setting) with the controls only — add a control for each, or give them "
                         "defaults.")


def _did_you_mean(value, known) -> str:
    import difflib

    close = difflib.get_close_matches(str(value), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@functools.cache
def _what_if_class():
    """The widget class, made once on first use (ipywidgets is imported only by lessons that draw)."""
    import ipywidgets as widgets

    class WhatIf(widgets.VBox):
        """The sliders above one HTML output; its plain-text form is the current frame's text."""

        def __init__(self, frame, sliders, maps):
            self._frame, self._maps, self._cache = frame, maps, {}
            self._sliders, self.text = sliders, ""
            self.output = widgets.HTML()
            super().__init__([*sliders.values(), self.output])
            for slider in sliders.values():
                slider.observe(self.redraw, names="value")
            self.redraw()

        def choice(self) -> dict:
            """The current setting as the frame's keyword arguments."""
            return {name: s.value if self._maps[name] is None else self._maps[name][s.value]
                    for name, s in self._sliders.items()}

        def redraw(self, _=None):
            key = tuple(s.value for s in self._sliders.values())
            if key not in self._cache:
                text, figures = _frame_parts(self._frame(**self.choice()))
                self._cache[key] = (text, _frame_html(text, figures))
            self.text, self.output.value = self._cache[key]

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            setting = ", ".join(f"{name} = {s.value}" for name, s in self._sliders.items())
            bundle["text/plain"] = (f"[what if: {setting}; run the cell in JupyterLab for its controls]\n"
                                   f"{self.text}")
            return bundle

    return WhatIf
