-- Argo CD health check for specfleet.dev/SpecModel.
-- argocd-cm: resource.customizations.health.specfleet.dev_SpecModel: | <this file>
-- A kill switch the guard engaged and a rollback are Degraded: the fleet serves, but not what
-- Git asked for. Set these to false to report them as Healthy instead. A trial (a canary pod
-- runs speculation beside the fleet) is Progressing, like a canary step of an Argo Rollout, and
-- so is a canary rollout's step (Progressing, reason CanaryStep); an aborted one is RolledBack.
local killSwitchIsDegraded = true
local rollbackIsDegraded = true

local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function is(kind, status)
  local c = condition(kind)
  return c ~= nil and c.status == status
end

local function message(kind)
  local c = condition(kind)
  if c == nil then
    return ""
  end
  return c.reason .. ": " .. (c.message or "")
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for specfleet to observe the SpecModel"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for specfleet to observe generation " .. obj.metadata.generation
  return hs
end

local speculation = condition("SpeculationActive")
if is("Degraded", "True") then
  hs.status = "Degraded"
  hs.message = message("Degraded")
elseif is("RolledBack", "True") and rollbackIsDegraded then
  hs.status = "Degraded"
  hs.message = message("RolledBack")
elseif speculation ~= nil and speculation.reason == "KillSwitchEngaged" and killSwitchIsDegraded then
  hs.status = "Degraded"
  hs.message = message("SpeculationActive")
elseif is("MetricsBlind", "True") then
  hs.status = "Degraded"
  hs.message = message("MetricsBlind")
elseif is("Progressing", "True") and condition("Progressing").reason == "CanaryStep" then
  hs.status = "Progressing"
  hs.message = message("Progressing")
elseif speculation ~= nil and speculation.reason == "CanaryTrial" then
  hs.status = "Progressing"
  hs.message = message("SpeculationActive")
elseif speculation ~= nil and speculation.reason == "DisabledByAnnotation" then
  hs.status = "Suspended"
  hs.message = message("SpeculationActive")
elseif is("Ready", "True") then
  hs.status = "Healthy"
  hs.message = message("Ready")
else
  hs.status = "Progressing"
  hs.message = message("Progressing")
end
return hs
