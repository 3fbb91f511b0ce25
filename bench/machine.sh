# Sourced by the GPU-machine scripts: machine_txt FILE COMMIT writes the date, the commit,
# the GPU (name, driver, memory, clocks, power cap) and Python's version to FILE.
machine_txt() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "commit: $2"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader \
      | sed 's/^/gpu: /'
    python3 --version
  } > "$1"
}
