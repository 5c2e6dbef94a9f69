"""Alerts: Kubernetes Events always (controller), Alertmanager v2 and a JSON webhook."""
