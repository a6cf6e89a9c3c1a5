"""``execute`` reads a name defined nowhere: every request fails with the ``NameError``."""


class TritonPythonModel:
    def execute(self, requests):
        return nowhere_defined  # noqa: F821 (the point of this model)
