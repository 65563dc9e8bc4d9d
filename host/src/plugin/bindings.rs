//! Host bindings generated from `wit/plugin.wit`. Private to `plugin/`:
//! nothing generated here appears in a public signature.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "map-sink-plugin",
});
