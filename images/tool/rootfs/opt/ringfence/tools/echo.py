"""echo: returns its arguments (a read-only probe of the whole dispatch path)."""


def run(arguments, context):
    return arguments
