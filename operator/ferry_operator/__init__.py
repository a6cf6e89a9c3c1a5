"""Ferry's Kubernetes operator: InferenceService -> serving Deployments, Services, HPA, routes.

Layers (imports point downwards only):

- ``handlers`` / ``main``: kopf wiring, thin; ``reconcile``: the one I/O sequence per object.
- ``api``: the only module that talks to the API server.
- ``desired``: pure; spec + observed children -> objects to apply/delete + status + events,
  built from ``spec``, ``mig``, ``rollout``, ``builders``, ``status`` and ``events``.
- ``config``, ``naming``: settings and names shared by all of the above.
"""
