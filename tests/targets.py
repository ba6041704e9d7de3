"""Random target distributions for the engine tests: Dirichlet draws plus exact and near ties."""
from __future__ import annotations

import numpy as np

CONCENTRATIONS = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)


def random_targets(n: int, seed: int, v_min: int = 3, v_max: int = 8, floor: float = 0.0) -> list[np.ndarray]:
    """``n`` targets over V in [v_min, v_max]: Dirichlet with concentrations from 0.05 to 5;
    every third has an exact tie (a copy of another entry, the top pair among them) and every
    fifth a near-tie (relative gap 1e-4). ``floor`` mixes in a uniform component so that
    every probability is positive (for the reverse-KL oracle, which needs ``p > 0``)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        v = int(rng.integers(v_min, v_max + 1))
        p = rng.dirichlet(np.full(v, CONCENTRATIONS[i % len(CONCENTRATIONS)]))
        order = np.argsort(-p)
        if i % 3 == 0:
            # exact tie: the top pair, or a lower pair, copied bit for bit
            a, b = (order[0], order[1]) if i % 2 == 0 else (order[1], order[2 % v])
            p[b] = p[a]
        elif i % 5 == 0:
            p[order[1]] = p[order[0]] * (1 - 1e-4)
        if floor:
            p = p + floor
        p = p / p.sum()
        out.append(p)
    return out
