#!/usr/bin/env bash
# Portability check for numerical changes: the pure-math test files under several thread counts,
# ATen CPU kernels and OpenBLAS kernels, one pytest run per configuration, one summary line each.
# Exit status 0 only if every configuration passes.
#
#   bash scripts/portability.sh            # the pairwise set (every pair of settings at least once)
#   bash scripts/portability.sh --full     # every combination (threads x ATen x OpenBLAS)
#   bash scripts/portability.sh --all      # also the slow tests and files (peaked rows, large V),
#                                          # the oracle sweeps at full size (COMPANION_FULL_SWEEPS=1)
#   bash scripts/portability.sh -- -k ties # extra pytest arguments after --
#   PORTABILITY_FILES="tests/test_ties.py tests/test_pooling.py" bash scripts/portability.sh
#                                          # other test files (or node ids) instead of the list below
#
# Why these settings: OMP_NUM_THREADS changes how torch splits reductions (sums, logsumexp), so
# the last bits of a result; ATEN_CPU_CAPABILITY picks torch's vectorised kernels (default = no
# SIMD, avx2, avx512 where the CPU has avx512f); OPENBLAS_CORETYPE picks the BLAS kernels that
# numpy and scipy (SLSQP in the oracles) run (Haswell, Zen, Prescott; SkylakeX with avx512f). A test that passes on one machine only is usually
# a tolerance tighter than its reference can guarantee.
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"

FILES=(
    tests/test_criteria.py tests/test_ties.py tests/test_near_ties.py tests/test_threshold_ties.py
    tests/test_certificates_oracle.py tests/test_certificate_properties.py tests/test_drafter_side.py
    tests/test_mars.py tests/test_margin_bounds.py tests/test_pooling.py tests/test_symbolic.py
    tests/test_symbolic_drafter.py tests/test_fused_passes.py tests/test_server_logprobs.py
)
SLOW_FILES=(tests/test_peaked_rows.py tests/test_large_vocab.py)
if [ -n "${PORTABILITY_FILES:-}" ]; then
    read -r -a FILES <<<"$PORTABILITY_FILES"
fi

full=0
marker=(-m "not slow")
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --full) full=1 ;;
        --all) FILES+=("${SLOW_FILES[@]}"); marker=(); export COMPANION_FULL_SWEEPS=1 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "portability.sh: unknown argument '$1' (expected --full, --all, or -- PYTEST_ARGS)" >&2; exit 2 ;;
    esac
    shift
done

THREADS=(1 2)
ATEN=(default avx2)
BLAS=(Haswell Zen Prescott)
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    # AVX-512 kernels only where the CPU has them (elsewhere they die with SIGILL)
    ATEN+=(avx512)
    BLAS+=(SkylakeX)
fi

configs=()
if [ "$full" -eq 1 ]; then
    for t in "${THREADS[@]}"; do for a in "${ATEN[@]}"; do for b in "${BLAS[@]}"; do
        configs+=("$t $a $b")
    done; done; done
else
    # Every (ATen, OpenBLAS) pair once, the thread count alternating so that every (threads, ATen)
    # and (threads, OpenBLAS) pair occurs too: 6 configurations (12 where the CPU has avx512f).
    for ai in "${!ATEN[@]}"; do for bi in "${!BLAS[@]}"; do
        configs+=("${THREADS[$(( (ai + bi) % 2 ))]} ${ATEN[$ai]} ${BLAS[$bi]}")
    done; done
fi

failed=0
printf '%-8s %-9s %-9s %-7s %6s  %s\n' threads aten openblas result time pytest
for cfg in "${configs[@]}"; do
    read -r t a b <<<"$cfg"
    start=$(date +%s)
    log="$(mktemp)"
    OMP_NUM_THREADS="$t" MKL_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" ATEN_CPU_CAPABILITY="$a" \
        OPENBLAS_CORETYPE="$b" "$PY" -m pytest -x -q -p no:cacheprovider -n 0 "${marker[@]}" "${FILES[@]}" "${extra[@]}" >"$log" 2>&1
    status=$?
    summary="$(grep -E '(passed|failed|error|no tests ran)' "$log" | tail -1)"
    if [ "$status" -eq 0 ]; then result=ok; else result=FAIL; failed=1; fi
    printf '%-8s %-9s %-9s %-7s %5ss  %s\n' "$t" "$a" "$b" "$result" "$(( $(date +%s) - start ))" "$summary"
    if [ "$status" -ne 0 ]; then
        grep -E '^(FAILED|ERROR|E  )' "$log" | head -8 | sed 's/^/    /'
    fi
    rm -f "$log"
done
exit "$failed"
