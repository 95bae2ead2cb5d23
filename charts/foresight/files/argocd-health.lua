-- Argo CD's health check for a TrainingJob (resource.customizations.health.foresight.dev_TrainingJob
-- in argocd-cm; docs/operations.md). Argo CD runs it with gopher-lua (Lua 5.1) on the live object.
-- As Argo CD's own batch Job check: a job that has not ended (waiting for its pods or Kueue,
-- training, or replacing a pod while it trains) is Progressing, so a later sync wave waits for
-- its model; Succeeded is Healthy, Failed Degraded, Suspended Suspended.
-- A status older than the spec (observedGeneration behind metadata.generation) is Progressing:
-- the operator has not acted on the change yet.
local hs = {status = "Progressing", message = "Waiting for the operator to act on the job"}
local status = obj.status
if status == nil or status.phase == nil then
  return hs
end
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.message = "Waiting for the operator to act on generation " .. generation
  return hs
end
local message = status.phase
if status.reason ~= nil then
  message = message .. " (" .. status.reason .. ")"
end
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == status.phase and c.message ~= nil and c.message ~= "" then
      message = message .. ": " .. c.message
    end
  end
end
local by_phase = {
  Created = "Progressing",
  Queued = "Progressing",
  Restarting = "Progressing",
  Running = "Progressing",
  Succeeded = "Healthy",
  Failed = "Degraded",
  Suspended = "Suspended",
}
hs.status = by_phase[status.phase] or "Unknown"
hs.message = message
return hs
