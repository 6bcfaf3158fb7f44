"""The torch part of the catalog: the functions that build what the families name
(`services.catalog.families`, each family's `builder`), reached through
`services.catalog.build`. Only the worker imports these; this package imports nothing."""
