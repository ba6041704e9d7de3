"""The certificate mathematics: acceptance criteria, exact certificates, their bounds and references.

Data flows one way, from the input checks to the verdicts:

=====================  ============================================================================
module                 holds
=====================  ============================================================================
``validation``         the input checks every certificate and criterion shares
``summary``            one top-k pass over a batch of target distributions
``criteria``           the acceptance criteria as lower level sets; ``PAPER_CRITERIA``
``pooling``            the pooling kernel: the cost of flattening a distribution on a set of tokens
``costs``              a level set's and a greedy tree's cost, from a row's sorted top
``certificates``       exact KL certificates and witnesses (``companion.certificates``)
``bounds``             margin bounds: what the top of the target alone guarantees
``verdicts``           whether a drafter is certified, per criterion (``companion.certified``)
``server_logprobs``    certificates from a server's top-k logprobs
``runs``               certified runs under a per-step KL budget
``stochastic``         speculative sampling's acceptance in expectation, for contrast
``oracle``             a brute-force reference for small vocabularies
``targets``            families of target distributions the chapters and tests compute on
=====================  ============================================================================
"""
