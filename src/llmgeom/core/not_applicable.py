"""Why a measure does not apply to a model: the texts of the tables' ``not_applicable`` columns, one wording each.

A module of its own (not ``core.layers``, which most analyses import): the rules that track it are
those that write these texts, so a new text reruns no other rule.

May import: nothing.
"""

#: why a measure of the attention (values, keys, attention weights, value edits) does not apply to a model without
#: attention layers (state-space models: Mamba, Mamba-2, Falcon-Mamba, RWKV): attention focusing's summary row, the
#: interventions' summary row (and the runner's empty tables' ``attrs``)
NO_ATTENTION_LAYERS = "no attention layers (a state-space model: root attribute attention_layers = [])"
