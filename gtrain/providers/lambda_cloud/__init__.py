"""The ``lambda`` provider: Lambda Cloud GPU instances through its public REST API (stdlib HTTP, no SDK), reached
over SSH. (``lambda`` is a Python keyword, hence the package name.)

- :mod:`.api`: the client (API key from ``LAMBDA_API_KEY`` or ``~/.lambda_cloud/lambda_keys``) and the one place
  Lambda's ``{"error": {"code", ...}}`` answers become gtrain errors;
- :mod:`.types`: the live instance-type list (or the bundled snapshot, offline), regions, the type a spec asks for;
- :mod:`.options`: the ``lambda:`` section of a spec;
- :mod:`.teardown`: instances and keys found by name (``gtrain-<cluster id>...``): ``down``, failed ``up``, ``gc``;
- :mod:`.provider`: :class:`LambdaProvider`.
"""

from gtrain.providers.lambda_cloud.options import LambdaOptions, lambda_options
from gtrain.providers.lambda_cloud.provider import LambdaProvider

__all__ = ["LambdaOptions", "LambdaProvider", "lambda_options"]
