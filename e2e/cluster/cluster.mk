# Local e2e cluster targets (included by the Makefile). See e2e/README.md.
.PHONY: cluster-install cluster-up cluster-down cluster-status

cluster-install: ## build/install the local cluster's binaries (cached under ~/.cache/specfleet)
	@e2e/cluster/install.sh >/dev/null

cluster-up: ## start the local e2e cluster (idempotent); prints the kubeconfig path
	@e2e/cluster/up

cluster-down: ## stop the local e2e cluster and delete its state
	@e2e/cluster/down

cluster-status: ## say whether the local cluster runs, and its kubeconfig
	@$(PY) -m e2e.cluster.harness status
