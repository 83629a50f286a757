"""stall: never answers, whatever it is given, until its deadline kills it (for tests of deadlines)."""

import time


def run(arguments, context):
    while True:
        time.sleep(60)
