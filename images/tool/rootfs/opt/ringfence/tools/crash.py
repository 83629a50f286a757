"""crash: raises, whatever it is given, as a buggy tool would (for tests of routing and failure)."""


def run(arguments, context):
    raise RuntimeError("crash: this tool always raises")
