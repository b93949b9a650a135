"""Drop-in namespaces for scripts written against other libraries."""
