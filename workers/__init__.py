"""The measurement agent: lease trials from the server, measure them, report.

It measures through ``compiler.runtime`` (build, check against numpy, time, isolated in
a child process) and reaches the server only through ``tuner_client``.
"""
