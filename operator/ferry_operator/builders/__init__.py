"""Pure builders: typed spec + plan -> Kubernetes manifests as plain dicts (no I/O, no kopf).

``pod`` (serving container, storage initializer, volumes), ``workloads`` (Deployment),
``networking`` (Services, HTTPRoutes), ``scaling`` (HPA, PodDisruptionBudget).
"""
