-- Argo CD health of a Skyscan Scan (resource.customizations.health.skyscan.io_Scan in argocd-cm).
-- It reads the summary the operator keeps for Flux's kstatus too: Stalled (the scan failed),
-- Ready (it reached its end: a final result, or the abort its soft delete asked for), Reconciling.
local health = {status = "Progressing", message = "waiting for the Skyscan operator"}
local status = obj.status
if status == nil or status.conditions == nil then
  return health
end
if obj.metadata.generation ~= nil and status.observedGeneration ~= obj.metadata.generation then
  health.message = "the Skyscan operator has not seen the latest change yet"
  return health
end
local summary = {}
for _, condition in ipairs(status.conditions) do
  summary[condition.type] = condition
end
local function said(condition)
  return (condition.reason or "") .. ": " .. (condition.message or "")
end
if summary.Stalled ~= nil and summary.Stalled.status == "True" then
  health.status = "Degraded"
  health.message = said(summary.Stalled)
elseif summary.Ready ~= nil and summary.Ready.status == "True" then
  health.status = "Healthy"
  health.message = said(summary.Ready)
elseif summary.Reconciling ~= nil and summary.Reconciling.status == "True" then
  health.message = said(summary.Reconciling)
end
return health
