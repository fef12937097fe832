# Sourced by the scripts/h200_*.sh harnesses: the output folder, a timed `step`, and the GPU/commit header.
#   step NAME SECONDS COMMAND...   runs COMMAND with a time limit into $out/NAME.log and appends its exit
#                                  status, duration and last line to $out/summary.txt, so that a step that runs
#                                  out of time still leaves the others' results
out=${OUT:-h200_out}
mkdir -p "$out"
step() {
    local name=$1 secs=$2
    shift 2
    local t0=$SECONDS
    timeout "$secs" "$@" > "$out/$name.log" 2>&1
    echo "$name rc=$? $((SECONDS - t0))s $(tail -n 1 "$out/$name.log" | cut -c1-300)" >> "$out/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$out/gpu.txt" 2>&1
# the device's copy of .git can lag the tree it was sent (its HEAD is then an older commit, marked dirty in a run's
# code.json): the code digest (trainers/provenance.py) names the tree itself
git rev-parse --short HEAD >> "$out/gpu.txt" 2>/dev/null
python3 -c "from trainers.provenance import code_digest; print('code digest', code_digest())" >> "$out/gpu.txt" 2>&1
