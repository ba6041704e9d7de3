"""The drafter's side: certificates from the drafter's own distribution ``q``, known before it proposes.

=====================  ============================================================================
module                 holds
=====================  ============================================================================
``rows``               the drafter's rows as the certificates read them: the sorted top of ``q``
``typical``            typical acceptance's certificate (Medusa's rule), a branch and bound
``certificates``       every other criterion's certificate and witness, and their soundness
=====================  ============================================================================
"""
