"""The docs site's generated parts: the reference pages read from the code (the command
line's parser, the router's settings model, the metrics registries, the profile's reader)
and the results tables and figures read from the committed JSON that bench commands wrote.

Not installed with specroute: ``mkdocs build`` loads ``docsgen/hooks.py``, which fills each
``<!-- docsgen: NAME ARGS -->`` marker of a page with what ``blocks.BLOCKS[NAME]`` returns.
"""
