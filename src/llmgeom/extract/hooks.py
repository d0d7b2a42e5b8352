"""Hook points and the one place where torch hooks are registered and the attention interface is patched.

The named points of the capture API (``extract.capture``, which re-exports them) and their registration: the
session of :func:`hooked` (module forward hooks and pre-hooks on blocks, projections and ``o_proj``; the
final-token cut) and :func:`capture_attention` (the attention function's entry in transformers'
``ALL_ATTENTION_FUNCTIONS`` overridden for the duration, or, for the families whose attention module computes
softmax(q.k) itself, hooks on that module: ``Family.module_attention``). ``tests/unit/pipeline/test_layout.py`` checks that no
other module of the package registers a torch hook or touches an attention interface. Where a family keeps its
parts is ``models.architectures``; what it is, ``models.families``.

Source: DESIGN.md sections 1 and 4 (one capture API); TransformerLens ``HookPoint`` / ``hooks()``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from llmgeom.models import architectures as arch
from llmgeom.models import families

EDITABLE = ("hook_resid_pre", "hook_resid_post", "attn.hook_k", "attn.hook_v")
ATTENTION_POINTS = ("attn.hook_z", "attn.hook_qk")
GLOBAL_POINTS = ("ln_final.hook_normalized", "hook_logits")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(hook_resid_pre|hook_resid_post|attn\.hook_k|attn\.hook_v|attn\.hook_z|attn\.hook_qk)$")

Hook = Callable[[Any, "HookPoint"], "torch.Tensor | None"]


def point_name(kind: str, layer: int | None = None) -> str:
    """The name of a hook point: ``point_name("attn.hook_v", 3) == "blocks.3.attn.hook_v"``; global points
    (``ln_final.hook_normalized``, ``hook_logits``) take no layer."""
    return kind if layer is None else f"blocks.{int(layer)}.{kind}"


@dataclass
class Batch:
    """A right-padded batch: ``ids``, ``mask``, ``pos`` [B, T] long on the model's device, ``last`` [B]
    (index of each prompt's final real token) and ``rows`` = arange(B)."""

    ids: torch.Tensor
    mask: torch.Tensor
    pos: torch.Tensor
    last: torch.Tensor
    rows: torch.Tensor


@dataclass
class AttentionCall:
    """What one attention function call receives: ``query`` [B, n_heads, T, head_dim], ``key``
    [B, n_kv_heads, T, head_dim] (post-RoPE), ``scaling``/``softcap`` (None where the module passes
    none: then ``families.attention_scaling`` / ``attention_softcap`` apply), ``sinks`` [n_heads]
    attention-sink logits (the call's ``s_aux``: a learned per-head logit outside q.k that joins the softmax
    and carries no value), None without sinks (``extract.attention.last_query_attention``), ``mask`` the
    ``attention_mask`` the call receives: [B or 1, 1 or n_heads, T_q, T_k] bool (True = may attend) or additive
    float (logits: 0 / ``finfo.min``, or a learned bias), with what the module merged in beyond
    ``transformers.masking_utils``' causal, padding and window masks (DeepSeek Sparse Attention's indexer, Doge's
    dynamic mask), None where the call passes none (:data:`CALL_EXTRAS`;
    ``extract.attention.final_query_mask_row``). ``probs``
    [B, n_heads, T, T]: the attention probabilities the attention module computed itself, for the families that
    bypass the attention interface (``families.Family.module_attention``: their query and key are then as
    projected, before any RoPE inside the module), else None: the final query's row is computed from query and key."""

    query: torch.Tensor
    key: torch.Tensor
    scaling: float | None
    softcap: float | None
    sinks: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    probs: torch.Tensor | None = None


@dataclass
class HookPoint:
    """The point a hook runs on: ``name``, ``layer`` (None for global points), the :class:`Batch` (None
    outside :func:`run`) and ``raw``, the module's own output (tensor or tuple) where there is one, set only while the
    hooks of the point run (a hook that keeps it must keep its own reference)."""

    name: str
    layer: int | None
    batch: Batch | None = None
    raw: Any = field(default=None, repr=False)


def first_tensor(x):
    """The hidden-state tensor of a module output: the output itself (recent transformers) or its first
    element (tuple outputs of older decoder layers; DESIGN.md sec. 4)."""
    return x[0] if isinstance(x, (tuple, list)) else x


def _replace_first(out, new):
    if isinstance(out, list):
        return [new, *out[1:]]
    if isinstance(out, tuple):
        return (new,) + tuple(out[1:])
    return new


def _as_list(h) -> list:
    return list(h) if isinstance(h, (list, tuple)) else [h]


def _parse(name: str, n_layers: int) -> tuple[str, int | None]:
    if name in GLOBAL_POINTS:
        return name, None
    m = _BLOCK.match(name)
    if not m:
        raise KeyError(f"unknown hook point {name!r}; valid: blocks.<l>.{{{', '.join(EDITABLE + ATTENTION_POINTS)}}}, "
                       f"{', '.join(GLOBAL_POINTS)} (llmgeom.extract.capture)")
    layer = int(m.group(1))
    if not 0 <= layer < n_layers:
        raise IndexError(f"hook point {name!r}: layer {layer} outside the model's {n_layers} layers")
    return m.group(2), layer


def _run_hooks(fns: Sequence[Hook], act, pt: HookPoint, batch, read_only: str | None = None):
    """Run the hooks of one point in order, each seeing the edits of those before it; returns the edited activation,
    or None when no hook returned one. ``read_only``: why the point cannot be edited (then a returned tensor raises
    ValueError with it). ``pt.raw`` lives only while the hooks run (else every hooked layer's output stays to the
    end)."""
    pt.batch = batch
    changed = None
    try:
        for fn in fns:
            new = fn(act, pt)
            if new is not None:
                if read_only:
                    raise ValueError(f"hook point {pt.name!r} is read-only{read_only}; a hook returned a tensor")
                act = changed = new
    finally:
        pt.raw = None
    return changed


def _notify(fns: Sequence[Hook], act, pt: HookPoint, batch) -> None:
    """Run the hooks of a read-only point whose hooks' return values are ignored (``hook_z``, ``hook_qk``)."""
    pt.batch = batch
    for fn in fns:
        fn(act, pt)


def final_rows(t: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Each prompt's final-token row of a [B, T, F] activation: [B, F], on ``t``'s device and in its dtype (the
    model's; ``capture.RowIndex.take`` gives float32 copies for storing)."""
    dev = t.device
    return t[batch.rows.to(dev), batch.last.to(dev)]


def on_o_proj_input(model, layer: int, fn: Callable) -> Any:
    """Register a forward pre-hook on block ``layer``'s attention output projection that calls ``fn(z)`` with its
    input z [B, T, n_heads*value_head_dim] (the attention output where ``hook_z`` is read there:
    ``Family.module_attention`` and ``Family.z_from_o_proj``), placed before any other pre-hook (the final-token
    cut's); returns the handle. The one reading of ``hook_z`` at ``o_proj``."""
    def pre(mod, args):
        fn(args[0])  # returns None: the projection's input stays as it is

    return arch.o_proj_module(model, layer).register_forward_pre_hook(pre, prepend=True)


class HookSession:
    """The hooks of one :func:`hooked` context: validated point names, then per kind of point one method that
    registers its torch hooks (:meth:`resid_pre`, :meth:`resid_post`, :meth:`projection`, :meth:`attention`, the
    final-token cut), then :meth:`remove`. ``state`` is the dict :func:`hooked` yields (its keys there)."""

    def __init__(self, model, hooks: Mapping[str, Hook | Sequence[Hook]], final_token_only: bool):
        self.model = model
        self.blocks = arch.decoder_layers(model)
        self.family = families.family_for(model.config)
        self.lat = families.latent_dims(model.config)  # multi-head latent attention: keys and values at the interface
        self.points = self._validate(hooks)
        self.state: dict = {"handles": [], "batch": None, "attention_seen": [], "global": {}, "model": model,
                            "active": True, "final_token_only": bool(final_token_only)}
        self.attn: dict[int, dict[str, list]] = {}  # layer -> kind -> hooks read at the attention function
        self.k_rope: dict[int, torch.Tensor] = {}  # latent attention: layer -> pre-RoPE k_rope [B, T, qk_rope_hd]

    def _validate(self, hooks) -> list[tuple[str, int | None, list]]:
        """(kind, layer, hooks) per point. Raises KeyError / IndexError as :func:`hooked` says."""
        parsed = [(*_parse(name, len(self.blocks)), _as_list(fns)) for name, fns in hooks.items()]
        attn_layers = {layer for kind, layer, _ in parsed if kind.startswith("attn.")}
        if attn_layers:
            with_attention = set(arch.attention_layers(self.model))
            bad = [point_name(k, l) for k, l, _ in parsed if k.startswith("attn.") and l not in with_attention]
            if bad:
                raise KeyError(f"hook points {bad}: these layers have no attention (attention layers of this model: "
                               f"{sorted(with_attention)}; architectures.attention_layers)")
        return parsed

    def _add(self, handle) -> None:
        self.state["handles"].append(handle)

    def register(self, stack: contextlib.ExitStack) -> None:
        """Register every point's hooks (the attention function's override enters ``stack``)."""
        if self.state["final_token_only"]:
            cut = _final_token_cut(self.state)
            for m in arch.final_token_modules(self.model):
                self._add(m.register_forward_pre_hook(cut))
        at_interface = ATTENTION_POINTS + (("attn.hook_k", "attn.hook_v") if self.lat is not None else ())
        for kind, layer, fns in self.points:
            if kind in GLOBAL_POINTS:
                self.state["global"][kind] = fns
            elif kind in at_interface:
                self.attn.setdefault(layer, {})[kind] = fns
            elif kind == "hook_resid_pre":
                self.resid_pre(layer, fns)
            elif kind == "hook_resid_post":
                self.resid_post(layer, fns)
            else:
                self.projection(kind, layer, fns)
        if self.attn:
            self.attention(stack)

    def resid_pre(self, layer: int, fns: list) -> None:
        """``blocks.{l}.hook_resid_pre``: a pre-hook on block l (its hidden-states input, positional or keyword)."""
        pt = HookPoint(point_name("hook_resid_pre", layer), layer)

        def pre(mod, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            pt.raw = h
            new = _run_hooks(fns, h, pt, self.state["batch"])
            if new is None:
                return None
            return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
        self._add(self.blocks[layer].register_forward_pre_hook(pre, with_kwargs=True))

    def resid_post(self, layer: int, fns: list) -> None:
        """``blocks.{l}.hook_resid_post``: a forward hook on block l (its first output)."""
        pt = HookPoint(point_name("hook_resid_post", layer), layer)

        def post(mod, args, out):
            pt.raw = out
            new = _run_hooks(fns, first_tensor(out), pt, self.state["batch"])
            return None if new is None else _replace_first(out, new)
        self._add(self.blocks[layer].register_forward_hook(post))

    def projection(self, kind: str, layer: int, fns: list) -> None:
        """``attn.hook_k`` / ``attn.hook_v`` (no latent attention): a forward hook on the key / value projection; in a
        fused layout the part is split out (``architectures.qkv_part``) and an edit written back into its columns."""
        part = "k" if kind == "attn.hook_k" else "v"
        pt = HookPoint(point_name(kind, layer), layer)
        fused = self.family.qkv != "separate"

        def post(mod, args, out):
            pt.raw = out
            o = first_tensor(out)
            new = _run_hooks(fns, arch.qkv_part(self.model, o, part), pt, self.state["batch"])
            if new is None:
                return None
            if not fused:
                return _replace_first(out, new)
            o2 = o.clone()
            o2[..., arch.qkv_columns(self.model, part).to(o.device)] = new.to(o2.dtype)
            return _replace_first(out, o2)
        mod = arch.kv_module(self.model, layer) if part == "k" else arch.v_module(self.model, layer)
        self._add(mod.register_forward_hook(post))

    def attention(self, stack: contextlib.ExitStack) -> None:
        """The points read at the attention function (``hook_z``, ``hook_qk``; keys and values under latent
        attention): :func:`capture_attention` for the pass, ``hook_z`` at ``o_proj``'s input where the family reads it
        there (differential attention: ``Family.z_from_o_proj``; ``Family.module_attention`` families hand it to
        :func:`capture_attention`'s function from there too)."""
        self.points_at = {l: {kd: HookPoint(point_name(kd, l), l) for kd in ATTENTION_POINTS + ("attn.hook_k",
                                                                                              "attn.hook_v")}
                          for l in self.attn}
        for l, fns in self.attn.items():
            if self.lat is not None and "attn.hook_k" in fns:  # the pre-RoPE k_rope columns of kv_a_proj_with_mqa
                self._add(arch.kv_module(self.model, l).register_forward_hook(_keep_k_rope(self.k_rope, l, self.lat)))
            if self.family.z_from_o_proj and fns.get("attn.hook_z"):
                self._add(on_o_proj_input(self.model, l, lambda z, l=l: self._z(l, z)))
        self.state["attention_seen"] = stack.enter_context(capture_attention(
            self.model, self._on_attention, before=self._latent_kv if self.lat is not None else None,
            extras=("sinks", "mask", "sparse_indices", "probs")))
        self.state["attention_layers"] = sorted(self.attn)

    def _z(self, layer: int, z) -> None:
        _notify(self.attn[layer].get("attn.hook_z", ()), z, self.points_at[layer]["attn.hook_z"], self.state["batch"])

    def _on_attention(self, layer, q, k, o, scaling, softcap, sinks=None, mask=None, sparse_indices=None, probs=None):
        fns = self.attn.get(layer)
        if fns is None:
            return
        if not self.family.z_from_o_proj:
            self._z(layer, o.reshape(*o.shape[:2], -1))  # [B, T, H*hd]: the heads concatenated
        if fns.get("attn.hook_qk") and sparse_indices is not None:
            raise families.UnsupportedArchitectureError(
                f"layer {layer}: the attention call selects its keys by sparse indices outside the attention mask "
                f"(implementation {self.model.config._attn_implementation!r}), so the keys each query sees cannot be "
                "read at hook_qk; load it with attn_implementation='sdpa'")
        call = AttentionCall(q, k, scaling, softcap, sinks, mask, probs)
        _notify(fns.get("attn.hook_qk", ()), call, self.points_at[layer]["attn.hook_qk"], self.state["batch"])

    def _latent_kv(self, layer, q, k, v):
        """Latent attention: ``hook_k`` (read-only) and ``hook_v`` (editable) before the attention call."""
        fns = self.attn.get(layer, {})
        B, H, T = v.shape[:3]
        pts, batch = self.points_at.get(layer, {}), self.state["batch"]
        if "attn.hook_k" in fns:  # [k_nope_h | pre-RoPE k_rope] per head -> [B, T, H*qk_hd]
            kr = self.k_rope.pop(layer).unsqueeze(1).expand(-1, H, -1, -1).to(k.dtype)
            pre = torch.cat([k[..., :self.lat.qk_nope_head_dim], kr], dim=-1).transpose(1, 2).reshape(B, T, -1)
            _run_hooks(fns["attn.hook_k"], pre, pts["attn.hook_k"], batch, read_only=(
                " under multi-head latent attention (its keys exist only inside the attention module)"))
        if "attn.hook_v" not in fns:
            return None
        new = _run_hooks(fns["attn.hook_v"], v.transpose(1, 2).reshape(B, T, -1), pts["attn.hook_v"], batch)
        return None if new is None else new.reshape(B, T, H, -1).transpose(1, 2).to(v.dtype)

    def remove(self) -> None:
        """Remove every handle (the context has ended)."""
        self.state["active"] = False
        for h in self.state["handles"]:
            h.remove()
        self.state["handles"].clear()


def _keep_k_rope(store: dict, layer: int, lat):
    """Forward hook on ``kv_a_proj_with_mqa`` (multi-head latent attention, :class:`families.LatentDims`):
    keeps its pre-RoPE k_rope columns [B, T, qk_rope_head_dim] (output columns kv_lora_rank:) in ``store[layer]``
    until the layer's attention call reads them."""
    r = lat.kv_lora_rank

    def keep(mod, args, out):
        store[layer] = first_tensor(out)[..., r:r + lat.qk_rope_head_dim]
    return keep


def _final_token_cut(state: dict):
    """Forward pre-hook for the modules of ``architectures.final_token_modules``: while ``capture.run`` has set a
    batch, the module's input [B, T, F] becomes [B, 1, F], each prompt's row at ``batch.last``; outside
    ``capture.run``, or for an input passed by keyword, nothing changes."""
    def cut(mod, args):
        b = state.get("batch")
        if b is None or not args:
            return None
        return (final_rows(args[0], b).unsqueeze(1), *args[1:])
    return cut


@contextlib.contextmanager
def hooked(model, hooks: Mapping[str, Hook | Sequence[Hook]], *, final_token_only: bool = False):
    """Context manager: run ``hooks`` (point name -> hook or list of hooks) during ``model``'s forward
    passes (:class:`HookSession`); every handle is removed on exit, also when the body raises.

    ``final_token_only``: in each ``capture.run`` the last block's attention output projection and MLP see
    each prompt's final token only (``extract.capture``'s docstring); for passes whose outputs are read at the final
    tokens only (prompt sets; not corpus sets, whose sampled positions need the whole last block). The values
    there are the full pass's up to float rounding (a matrix product over B rows instead of B*T takes
    other kernels: ~1e-6 relative in float32).

    Yields:
        a dict: ``"handles"`` (the torch hook handles: one per module point, and the final-token cut's), ``"batch"``
        (set by ``capture.run``), ``"attention_seen"`` (layers whose attention went through the attention
        interface in the current ``capture.run``, when ``hook_z``/``hook_qk`` points are hooked), ``"model"``,
        ``"active"`` (False once the context has exited), ``"final_token_only"``.

    Raises:
        KeyError: an unknown point name, or an ``attn.*`` point of a layer without attention (hybrid and
            state-space models: ``architectures.attention_layers``). IndexError: a layer outside the model.
    """
    session = HookSession(model, hooks, final_token_only)
    try:
        with contextlib.ExitStack() as stack:
            session.register(stack)
            yield session.state
    finally:
        session.remove()


def _own_eager(module):
    import importlib

    return importlib.import_module(type(module).__module__).eager_attention_forward


#: The optional keywords :func:`capture_attention` hands to its ``fn`` (those named in its ``extras``), each read
#: from one attention-function call ``(attention_mask, kwargs)``:
#:
#: - ``sinks``: [n_heads] attention-sink logits, the ``s_aux`` the module passes (a learned per-head logit outside
#:   q.k that joins each query's softmax and carries no value: gpt_oss, flint, granite_swa, mimo_v2_flash's sliding
#:   layers), or None;
#: - ``mask``: the ``attention_mask`` the function receives: [B or 1, 1 or n_heads, T_q, T_k] bool (True = may
#:   attend; sdpa) or additive float (eager: 0 / ``finfo.min``; Doge's learned dynamic bias), as built by
#:   ``transformers.masking_utils`` and by the module itself (DeepSeek Sparse Attention merges its indexer's
#:   non-selected keys in, Doge its dynamic mask); None where the call passes none (sdpa with ``is_causal``), a 2-D
#:   padding mask under flash attention;
#: - ``sparse_indices``: the ``indices`` of the keys a sparse-attention module selects per query, passed instead of
#:   merging them into the mask under other implementations than eager/sdpa (DeepSeek Sparse Attention), or None;
#: - ``probs``: [B, n_heads, T, T] the attention probabilities the module itself computed (``Family.module_attention``
#:   families only, :func:`_module_attention_hooks`), else None: the caller computes them from q and k.
#:
#: A ``module_attention`` family passes None for the others (its probabilities carry its masks and biases).
CALL_EXTRAS: dict[str, Callable] = {
    "sinks": lambda mask, kwargs: kwargs.get("s_aux"),
    "mask": lambda mask, kwargs: mask,
    "sparse_indices": lambda mask, kwargs: kwargs.get("indices"),
    "probs": lambda mask, kwargs: None,
}


def _attention_interfaces(model) -> list:
    """The attention-function registries ``model``'s layers look their function up in: transformers' shared
    ``ALL_ATTENTION_FUNCTIONS``, and a modeling file's own ``AttentionInterface`` instance where it keeps one (Doge's
    ``modeling_doge.ALL_ATTENTION_FUNCTIONS``: its local entries first, then the shared global ones)."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    found = {id(ALL_ATTENTION_FUNCTIONS): ALL_ATTENTION_FUNCTIONS}
    for blk in arch.decoder_layers(model):
        for sub in blk.modules():
            iface = getattr(sys.modules.get(type(sub).__module__), "ALL_ATTENTION_FUNCTIONS", None)
            if isinstance(iface, AttentionInterface):
                found.setdefault(id(iface), iface)
    return list(found.values())


def _ask_for_probabilities(module):
    """A forward pre-hook (``with_kwargs``) that calls ``module`` with ``output_attentions=True``, or None where its
    forward takes no such argument (then it returns its probabilities anyway: MPT)."""
    import inspect

    params = list(inspect.signature(module.forward).parameters)
    if "output_attentions" not in params:
        return None
    at = params.index("output_attentions")

    def pre(mod, args, kwargs):
        if len(args) > at:
            return args[:at] + (True,) + args[at + 1:], kwargs
        kwargs["output_attentions"] = True
        return args, kwargs

    return pre


def _module_attention_hooks(model, fn: Callable, seen: list, *, with_value: bool, extras: tuple[str, ...]) -> list:
    """The hooks of :func:`capture_attention` for a ``Family.module_attention`` model (its attention modules compute
    softmax(q.k) themselves): per attention layer, the query/key/value projections' outputs split into heads, the
    attention output at ``o_proj``'s input (a pre-hook placed first, before any final-token cut) and, when the
    attention module returns, ``fn`` with its probabilities (``probs``: the module output's second element). Returns
    the torch hook handles.

    Raises:
        UnsupportedArchitectureError: (during the forward) an attention module that returned no probabilities."""
    s = families.summarize(model.config)
    n_of = {"q": s.n_heads, "k": s.n_kv_heads, "v": s.n_kv_heads}
    handles = []

    def keep(parts, st):  # [B, T, n*hd] -> [B, n, T, hd] for each part the module's output holds
        def hook(mod, args, out):
            for p in parts:
                x = arch.qkv_part(model, out, p)
                st[p] = x.reshape(*x.shape[:2], n_of[p], -1).transpose(1, 2)
        return hook

    for i in arch.attention_layers(model):
        st: dict = {}
        by_module: dict[int, list] = {}  # a fused layout: one module holds all three parts
        for p in "qkv":
            m = arch.projection_module(model, i, p)
            by_module.setdefault(id(m), [m, ""])[1] += p
        for m, parts in by_module.values():
            handles.append(m.register_forward_hook(keep(parts, st)))

        def fire(i, st):  # once both the attention output and the probabilities are there (o_proj may run inside
            if "o" not in st or "probs" not in st:  # the attention module, BLOOM, or after it, GIT)
                return
            seen.append(i)
            extra = {name: st["probs"] if name == "probs" else None for name in extras}  # CALL_EXTRAS
            qkv = (st["q"], st["k"], st["v"]) if with_value else (st["q"], st["k"])
            fn(i, *qkv, st["o"], None, None, **extra)
            st.clear()

        def z(x, i=i, st=st):
            st["o"] = x.reshape(*x.shape[:2], s.n_heads, -1)
            fire(i, st)

        handles.append(on_o_proj_input(model, i, z))
        att = arch.attention_modules(model)[i]
        ask = _ask_for_probabilities(att)
        if ask is not None:
            handles.append(att.register_forward_pre_hook(ask, with_kwargs=True))

        def post(mod, args, out, i=i, st=st):
            probs = out[1] if isinstance(out, (tuple, list)) and len(out) > 1 else None
            if probs is None:
                raise families.UnsupportedArchitectureError(
                    f"{type(mod).__name__} (layer {i}) returned no attention probabilities with output_attentions=True;"
                    " llmgeom reads this family's attention from them (families.Family.module_attention)")
            st["probs"] = probs
            fire(i, st)

        handles.append(att.register_forward_hook(post))
    return handles


@contextlib.contextmanager
def capture_attention(model, fn: Callable, *, with_value: bool = False, before: Callable | None = None,
                      extras: tuple[str, ...] = ()):
    """While active, every call of ``model``'s attention function also calls
    ``fn(layer, query, key, attn_output, scaling, softcap)`` (``with_value``: ``fn(layer, query, key, value,
    attn_output, scaling, softcap)``, ``value`` [B, n_kv_heads, T, value_head_dim]; ``extras``: names of
    ``CALL_EXTRAS``, each also given as that keyword: the call's attention-sink logits, attention mask, sparse
    indices, the module's own probabilities) with the tensors the model uses;
    ``before(layer, query, key, value)``, when given, runs before the attention function and may return a tensor
    of the value's shape that the function then receives instead of ``value`` (an edit of the values where no
    module outputs them: multi-head latent attention, ``extract.capture``):

    - ``query`` [B, n_heads, T, head_dim] and ``key`` [B, n_kv_heads, T, head_dim] after RoPE (and
      q_norm/k_norm, query pre-scaling where the family has them), before GQA/MQA repetition;
    - ``attn_output`` [B, T, n_heads, head_dim]: the attention-weighted sum of values (the input of
      ``o_proj_module`` once the heads are concatenated);
    - ``scaling``/``softcap``: the values the module passes to the attention function (None where it
      passes none: then ``attention_scaling``/``attention_softcap`` apply);
    - the ``extras`` keywords: as ``CALL_EXTRAS`` describes them.

    The model's attention implementation (sdpa, flash attention, eager) runs unchanged; nothing of
    size T x T is materialized here. Implemented by overriding, for the duration, the entry of the
    current implementation in ``transformers``' ``ALL_ATTENTION_FUNCTIONS`` and in a modeling file's own
    registry where it has one (:func:`_attention_interfaces`; process-wide: calls of other models pass through
    unchanged).

    ``Family.module_attention`` families (the module computes softmax(q.k) itself, bypassing the interface: BLOOM,
    MPT, XGLM, GPT-Neo, GPT-1, Falcon, GPT-NeoX-Japanese) are read by hooks on their modules instead
    (:func:`_module_attention_hooks`): ``query``/``key``/``value`` as the projections output them (no RoPE: these
    families have none, or, Falcon and GPT-NeoX-Japanese, apply it inside the module afterwards), ``attn_output``
    the output projection's input, ``scaling``/``softcap`` None, ``probs`` the module's own probabilities (with its
    ALiBi or position bias, local window and mask; the module materializes them anyway, asked with
    ``output_attentions=True`` where it returns them only then, which takes Falcon's eager branch). ``before`` does not
    apply there.

    Raises:
        UnsupportedArchitectureError: a family whose attention does not use the attention interface.
        KeyError: a name in ``extras`` that ``CALL_EXTRAS`` does not have.
        ValueError: ``before`` for a ``module_attention`` family.
    """
    getters = {name: CALL_EXTRAS[name] for name in extras}
    if families.family_for(model.config).module_attention:
        if before is not None:
            raise ValueError("capture_attention(before=...) edits the values at the attention interface, which "
                             f"{families.text_config(model.config).model_type!r} does not call (Family.module_attention)")
        seen_m: list = []
        handles = _module_attention_hooks(model, fn, seen_m, with_value=with_value, extras=tuple(getters))
        try:
            yield seen_m
        finally:
            for h in handles:
                h.remove()
        return

    layer_of = {id(sub): i for i, blk in enumerate(arch.decoder_layers(model)) for sub in blk.modules()}
    impl = families.text_config(model.config)._attn_implementation or "eager"
    seen: list = []
    wrap = _interface_wrapper(fn, seen, layer_of, with_value=with_value, before=before, getters=getters)
    saved = []  # (registry, had a local entry, that entry)
    try:
        for iface in _attention_interfaces(model):
            saved.append((iface, impl in iface._local_mapping, iface._local_mapping.get(impl)))
            iface[impl] = wrap(iface.get(impl))
        yield seen
    finally:
        for iface, had_local, prev_local in reversed(saved):
            if had_local:
                iface._local_mapping[impl] = prev_local
            else:
                del iface._local_mapping[impl]


def _interface_wrapper(fn: Callable, seen: list, layer_of: dict, *, with_value: bool, before: Callable | None,
                       getters: dict) -> Callable:
    """``wrap(inner) -> wrapper``: an attention function that runs ``before``, then ``inner`` (the registry's entry;
    None: the calling module's own ``eager_attention_forward``), then ``fn`` with what the call received and
    returned (:func:`capture_attention`). Every module of block i counts as block i's attention (``layer_of``: the
    module that calls the interface may sit below the one ``architectures.attention_modules`` names, e.g. an
    inner self-attention); a second call in one block is seen twice."""
    def wrap(inner):
        def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            f = inner if inner is not None else _own_eager(module)
            layer = layer_of.get(id(module))
            if before is not None and layer is not None:
                new = before(layer, query, key, value)
                value = value if new is None else new
            out = f(module, query, key, value, attention_mask, *args, **kwargs)
            if layer is not None:
                seen.append(layer)
                extra = {name: get(attention_mask, kwargs) for name, get in getters.items()}
                qkv = (query, key, value) if with_value else (query, key)
                fn(layer, *qkv, out[0], kwargs.get("scaling"), kwargs.get("softcap"), **extra)
            return out
        return wrapper
    return wrap

