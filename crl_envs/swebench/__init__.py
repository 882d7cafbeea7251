"""SWE-bench as a text env: dataset, tools, sandboxes, official grading.

- ``data``: task rows (SWE-bench Verified, the toy task) in swebench 5.x's format.
- ``tools``: ``bash``, ``str_replace_editor``, ``submit`` and their text call syntax.
- ``sandbox``: ``Sandbox``, ``LocalSandbox`` (host checkout), ``DockerSandbox`` (SWE-bench image).
- ``images``: the toy task's Docker image, built offline (``crl swe build-image toy``).
- ``grading``: swebench's test spec, log parsers and report.
- ``env``: ``SWEBenchEnv`` (``CRL/SWEBench-v0``, ``CRL/SWEBenchToy-v0``).
- ``oracle``: ``GoldPatchAgent``.

Heavy imports (swebench, docker) happen in the modules that need them, not here.
"""
