"""Your own tools: tool packages in the user's project (docs/TOOLS.md is the reference).

A tool package is a folder named after its tool:

    tools/jq_table/
        manifest.json        what it takes and what it risks (ringfence_server.control.registry; every field in
                             docs/TOOLS.md), and the image it runs in ("image")
        jq_table.py          its code, against the runner's tool API (ringfence_tool):
                             run(arguments, context) -> content, or raise ToolError(class, message)
        test_jq_table.py     its own unittest tests

- `packages` loads packages for the control plane (`[tools] packages` in the config), beside
  the built-in tools, which are the same thing in the layout they always had (see there);
- `scaffold` is `ringfence tools new NAME`: a package that works and a child image spec that
  lays its code;
- `check` is `ringfence tools check DIR...`: a manifest's checks, then the code and the tests in
  the sandbox, in the tool's own image;
- `cli` registers both under `ringfence tools`.

The code reaches the sandbox inside an image: an image spec's `"tools"` key
(ringfence_server.imagebuild.spec) lays `<name>.py` at /opt/ringfence/tools/<name>.py, where the runner
loads it. The manifest never enters the image: the control plane reads it from the package.
"""
