#!/bin/sh
# gpufleet's TaskProlog for Slurm: a task in a gpufleet booking's reservation gets
# GPUFLEET_RESERVATION_ID, so the agent's use report counts its processes as that
# booking's (not as foreign use). It prints `export NAME=value` lines, which Slurm
# applies to the task's environment; it leaves CUDA_VISIBLE_DEVICES as Slurm set it
# (the GPUs Slurm chose inside the reservation).
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
exit 0
