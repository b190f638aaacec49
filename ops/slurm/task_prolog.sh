#!/bin/sh
# gpufleet's TaskProlog for Slurm: a task in a gpufleet booking's reservation gets
# GPUFLEET_RESERVATION_ID, so the agent's use report counts its processes as that
# booking's (not as foreign use). It prints `export NAME=value` lines, which Slurm
# applies to the task's environment. It keeps the GPUs Slurm chose, but names them as
# CUDA reads them: Slurm without its NVML AutoDetect plugin puts gres indexes in
# CUDA_VISIBLE_DEVICES (a MIG job's `6,7` would be whole GPUs 6 and 7 to CUDA), so the
# indexes become the GPU/MIG UUIDs the agent's inventory gives them
# (`gpufleet-agent gres-uuids`, numbered as `gpufleet slurm conf` wrote gres.conf).
# Where the agent cannot say (no agent, an index it does not know), Slurm's value stays.
# GPUFLEET_AGENT names the agent's command when it is not `gpufleet-agent` on PATH.
#
# Install: slurm.conf `TaskProlog=/path/to/gpufleet-task-prolog` (this file,
# executable) on every node (docs/operator.md, "Slurm").
#
# SLURM_JOB_RESERVATION is `gpufleet-<reservationId>`, `gpufleet-<id>--<node>` for a
# booking reserved node by node, or several of them comma-separated: the first
# gpufleet one names the booking.
reservations=${SLURM_JOB_RESERVATION:-}
old_ifs=$IFS
IFS=,
for name in $reservations; do
    case $name in
        gpufleet-?*)
            id=${name#gpufleet-}
            id=${id%%--*}
            case $id in
                *[!A-Za-z0-9_-]*) ;;  # not an id gpufleet makes: say nothing
                *)
                    echo "export GPUFLEET_RESERVATION_ID=$id"
                    break
                    ;;
            esac
            ;;
    esac
done
IFS=$old_ifs

# Slurm's global indexes: SLURM_STEP_GPUS/SLURM_JOB_GPUS (CUDA_VISIBLE_DEVICES holds
# job-local ones under ConstrainDevices), else CUDA_VISIBLE_DEVICES itself.
indexes=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}}
case $indexes in
    '' | *[!0-9,]*) ;;  # no GPUs, or already names, not indexes
    *)
        uuids=$("${GPUFLEET_AGENT:-gpufleet-agent}" gres-uuids "$indexes" 2>/dev/null) || uuids=
        case $uuids in
            '' | *[!A-Za-z0-9,-]*) ;;
            *) echo "export CUDA_VISIBLE_DEVICES=$uuids" ;;
        esac
        ;;
esac
exit 0
