"""Research built on the library, outside it: each subfolder is one investigation (code, scripts, results,
tests, a report). The library never imports from here."""
