-- Argo CD health check for apps/Deployment that knows deployguard's rollbacks.
--
-- Install: argocd-cm key resource.customizations.health.apps_Deployment
-- (config/argocd/argocd-cm-patch.yaml carries this file verbatim). It replaces
-- Argo CD's built-in Deployment check, so apart from the guard's rule below it is
-- that check line for line: gitops-engine pkg/health/health_deployment.go,
-- getAppsv1DeploymentHealth (the same from Argo CD v3.2 to v3.6), same
-- branches, order and messages.
--
-- Argo CD runs health scripts without Lua's string library: text is built
-- with "..", which prints whole numbers as Go's %d does.

local hs = {}
local spec = obj.spec or {}
local status = obj.status or {}
local conditions = status.conditions or {}

-- Built-in check, but for the guard's verdict after the generation check.
if spec.paused == true then
  hs.status = "Suspended"
  hs.message = "Deployment is paused"
  return hs
end

if (obj.metadata.generation or 0) > (status.observedGeneration or 0) then
  hs.status = "Progressing"
  hs.message = "Waiting for rollout to finish: observed deployment generation less than desired generation"
  return hs
end

-- deployguard: after it rolls a failed revision back, the Deployment runs the
-- old template again and upstream's conditions read healthy. The guard says so
-- in a condition the Deployment controller keeps: Stalled=True, reason
-- AutoRollback, until a new template is applied or the rollback is accepted.
-- It is read after the paused and generation checks, in kstatus's order: a
-- new template reads as Progressing until the Deployment controller sees it.
for _, c in ipairs(conditions) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = (c.message or "")
    if c.reason ~= nil and c.reason ~= "" then
      hs.message = c.reason .. ": " .. hs.message
    end
    return hs
  end
end

-- The first Progressing condition, as getAppsv1DeploymentCondition finds it.
local progressing = nil
for _, c in ipairs(conditions) do
  if c.type == "Progressing" then
    progressing = c
    break
  end
end

local updated = status.updatedReplicas or 0
local replicas = status.replicas or 0
local available = status.availableReplicas or 0

if progressing ~= nil and progressing.reason == "ProgressDeadlineExceeded" then
  -- Go's %q; object names (DNS subdomains) need no escaping.
  hs.status = "Degraded"
  hs.message = "Deployment \"" .. obj.metadata.name .. "\" exceeded its progress deadline"
elseif spec.replicas ~= nil and updated < spec.replicas then
  hs.status = "Progressing"
  hs.message = "Waiting for rollout to finish: " .. updated .. " out of " .. spec.replicas .. " new replicas have been updated..."
elseif replicas > updated then
  hs.status = "Progressing"
  hs.message = "Waiting for rollout to finish: " .. (replicas - updated) .. " old replicas are pending termination..."
elseif available < updated then
  hs.status = "Progressing"
  hs.message = "Waiting for rollout to finish: " .. available .. " of " .. updated .. " updated replicas are available..."
else
  hs.status = "Healthy"
end
return hs
