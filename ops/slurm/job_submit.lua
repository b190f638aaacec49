--[[
gpufleet's job_submit.lua for Slurm before 23.11 (job_submit/lua, Lua 5.1).

Every job that asks for GPUs gets --gres-flags=enforce-binding: it may use only GPUs
bound to the cores it was given. With `gpufleet slurm conf --socket-per-gpu` (a socket
of its own cores per GPU) and the bridge in `cores` mode (a booking reserves its GPUs'
cores), a job in a booking's reservation then gets at most the booked GPUs, and a job
outside gets only GPUs whose cores no booking holds.

With BOOKING_QOS true (below; only where a booking's QOS exists, see docs/operator.md),
a job in a booking's reservation (`gpufleet-<id>` or `gpufleet-<id>--<node>`) runs under
that booking's QOS, `gpufleet-<id>`, whose `GrpTRES=gres/gpu:<type>=n` caps the GPUs
all its jobs together hold at what was booked (slurmdbd, AccountingStorageEnforce=limits).

Install: copy to the directory of slurm.conf as job_submit.lua and set
JobSubmitPlugins=lua (see docs/operator.md, "Slurm").
]]

-- Set true where the bridge keeps each booking's QOS `gpufleet-<id>` in slurmdbd (its
-- `booking_qos`, on wherever sacctmgr reaches slurmdbd): Slurm refuses a job naming a
-- QOS that does not exist.
local BOOKING_QOS = false

local GPU_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task" }

local function wants_gpu(job_desc)
  for _, name in ipairs(GPU_FIELDS) do
    local value = job_desc[name]
    if value ~= nil and string.find(value, "gpu", 1, true) then
      return true
    end
  end
  return false
end

-- Lua 5.1 has no bit operators: add the flag unless its bit is already set.
local function with_flag(bits, flag)
  if math.floor(bits / flag) % 2 == 1 then
    return bits
  end
  return bits + flag
end

-- The booking's QOS for a job in one of its reservations (the first gpufleet one), or nil.
local function booking_qos(reservation)
  if reservation == nil then
    return nil
  end
  for name in string.gmatch(reservation, "[^,]+") do
    local id = string.match(name, "^gpufleet%-([A-Za-z0-9_-]+)$")
    if id ~= nil then
      local cut = string.find(id, "--", 1, true)
      if cut ~= nil then
        id = string.sub(id, 1, cut - 1)
      end
      if id ~= "" then
        return "gpufleet-" .. id
      end
    end
  end
  return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  if wants_gpu(job_desc) then
    job_desc.bitflags = with_flag(job_desc.bitflags or 0, slurm.GRES_ENFORCE_BIND)
  end
  if BOOKING_QOS then
    local qos = booking_qos(job_desc.reservation)
    if qos ~= nil then
      job_desc.qos = qos
    end
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if wants_gpu(job_desc) then
    job_desc.bitflags = with_flag(job_desc.bitflags or 0, slurm.GRES_ENFORCE_BIND)
  end
  return slurm.SUCCESS
end

return slurm.SUCCESS
