"""Print pyproject.toml's dependencies (and those of the extras named), one a line.

Used by the Dockerfiles to install the dependencies in a layer of their own, before the
source is copied: ``python requirements.py pyproject.toml [EXTRA ...] > requirements.txt``.
"""

import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
requirements = list(project["dependencies"])
for extra in sys.argv[2:]:
    requirements += project["optional-dependencies"][extra]
print("\n".join(requirements))
