"""The tuning server: records database, REST jobs, scheduler and dispatch queue.

It imports ``schemas`` and ``compiler.templates`` (config spaces, cost-model features)
and never ``compiler.runtime`` or ``workers``: it does not build or run kernels.
"""
