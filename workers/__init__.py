"""The measurement agent: lease trials from the server, measure them, report.

It measures through ``compiler.runtime`` (build, check against numpy, time, isolated in
a child process); the polling loop arrives with the server.
"""
