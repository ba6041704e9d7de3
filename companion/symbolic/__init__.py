"""Symbolic derivations (sympy) that the chapters display and the tests check against numerics.

=====================  ============================================================================
module                 holds
=====================  ============================================================================
``certificates``       the target side: the theory chapters' certificates and bounds
``drafter_side``       the drafter-side certificates of :mod:`companion.drafter.certificates`
``tree_quadratic``     whether (m+1) gamma^2/4 bounds the margin-only tree certificate
=====================  ============================================================================
"""
