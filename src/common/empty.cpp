// Placeholder so a component with no sources yet still forms a library.
