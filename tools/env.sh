# Sourced by the tools and job scripts: the run-time environment of one rank
# per core. Not used by the tests, which keep the machine's own settings.

# One BLAS thread per rank: otherwise OpenBLAS takes every core in every rank.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# OpenBLAS 0.3.21 falls back to its generic (Prescott) kernels on CPUs it does
# not recognise, e.g. inside some VMs, at a quarter of the speed. Where the CPU
# has AVX-512 and nobody chose a core type, use the SkylakeX kernels.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE=SkylakeX
fi

# Open MPI as root inside containers; oversubscription for more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
