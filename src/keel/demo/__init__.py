"""The offline demo: a bundled sample service and the scripted model that fixes it."""
