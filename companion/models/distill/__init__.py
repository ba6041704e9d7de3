"""SmolLM2-135M-Instruct's drafter, distilled by this project: recipe, data, training and build.

The drafter is a small causal LM with the target's tokenizer, fitted to agree with the target
the way assistant models and EAGLE or Medusa heads are fitted to theirs: on the target's own
greedy answers (sequence-level distillation), matching its next-token distribution at every step
(soft labels). ``companion build-drafter`` rebuilds it (:mod:`companion.models.distill.cli`); the
committed build lives in ``companion/assets/smollm2_drafter`` and loads with
``load_pair("smollm2")``. This package is a trainer: the loaders never import it.
"""
