"""The Redis protocol between producers and workers: every key and TTL (keys.py), the Lua scripts
(scripts/*.lua, loaded one way) and the operations that run them; nothing else writes these keys."""
