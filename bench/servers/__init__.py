"""Servers that exist only to be measured against: a stub SGLang backend and a bare proxy."""
