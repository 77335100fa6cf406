//! A tool's `routes`: each entry parsed into a [`Route`], its steps, its
//! `details` bindings and its `bind_request` checked, and the list as a
//! whole (no route twice, every path only by name).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use super::{Check, RawTool};
use crate::derive::policy::route::{DetailBinding, Route};
use crate::derive::policy::{DetailField, DetailType, FieldKind};

impl Check<'_> {
    /// A tool's `routes` (and its opt-in for a route that allows every
    /// path). `proxied`: whether its resource is a proxy resource (`None`
    /// when the resource itself is in error). A proxy tool must list at
    /// least one route; any other tool none.
    pub(super) fn routes(
        &mut self,
        t: &RawTool,
        key: &str,
        proxied: Option<bool>,
        tool_steps: &BTreeSet<String>,
        declared: Option<&BTreeMap<String, DetailType>>,
    ) -> Vec<Route> {
        let every_path_ok = t
            .allow_every_path_for_this_tool
            .as_ref()
            .is_some_and(|b| *b.get_ref());
        let Some(list) = &t.routes else {
            if proxied == Some(true) {
                self.bad(
                    t.resource.span(),
                    format!("{key}.routes"),
                    "a tool on a delivery = \"proxy\" resource must list the calls it may make: routes = [\"GET /path/{var}\", ...]",
                );
            }
            if let Some(b) = &t.allow_every_path_for_this_tool {
                self.bad(
                    b.span(),
                    format!("{key}.allow_every_path_for_this_tool"),
                    "only a tool with routes takes this key",
                );
            }
            return Vec::new();
        };
        if proxied == Some(false) {
            self.bad(
                list.span(),
                format!("{key}.routes"),
                "only a tool on a source = \"service\", delivery = \"proxy\" resource takes routes",
            );
            return Vec::new();
        }
        if list.get_ref().is_empty() {
            self.bad(list.span(), format!("{key}.routes"), "lists no route, so the tool could never make a call; name its routes or remove the tool");
        }
        let mut out: Vec<Route> = Vec::new();
        for (i, v) in list.get_ref().iter().enumerate() {
            let at = format!("{key}.routes[{i}]");
            let Some(route) = self.route(v, &at, list.span(), tool_steps, declared) else {
                continue;
            };
            if route.allows_every_path() && !every_path_ok {
                self.bad(
                    list.span(),
                    at,
                    "allows every path of the service; list the calls the tool makes, or opt in by name with allow_every_path_for_this_tool = true",
                );
                continue;
            }
            if out.iter().any(|r| r.text == route.text) {
                self.bad(list.span(), at, "route listed twice");
                continue;
            }
            out.push(route);
        }
        out
    }

    /// One entry of a tool's `routes`: a string `"METHOD /path"`, or a
    /// table with its `steps` (each one of the tool's), `details` bindings
    /// and `bind_request`. `None` after reporting what is wrong with it.
    fn route(
        &mut self,
        v: &toml::Value,
        at: &str,
        span: Range<usize>,
        tool_steps: &BTreeSet<String>,
        declared: Option<&BTreeMap<String, DetailType>>,
    ) -> Option<Route> {
        let mut bindings = None;
        let mut bind_request = None;
        let (text, steps) = match v {
            toml::Value::String(s) => (s.clone(), None),
            toml::Value::Table(tbl) => {
                bindings = tbl.get("details");
                bind_request = tbl.get("bind_request");
                let unknown = tbl
                    .keys()
                    .find(|k| !["route", "steps", "details", "bind_request"].contains(&k.as_str()));
                let text = tbl.get("route").and_then(|r| r.as_str());
                let steps = tbl.get("steps").map(|s| {
                    s.as_array().and_then(|a| {
                        a.iter()
                            .map(|x| x.as_str().map(str::to_string))
                            .collect::<Option<BTreeSet<String>>>()
                    })
                });
                match (unknown, text, steps) {
                    (None, Some(text), None) => (text.to_string(), None),
                    (None, Some(text), Some(Some(steps))) if !steps.is_empty() => {
                        (text.to_string(), Some(steps))
                    }
                    _ => {
                        self.bad(span.clone(), at.to_string(), "a route table is { route = \"METHOD /path\", steps = [\"<step>\", ...], details = { <variable> = \"<type>.<field>\", ... }, bind_request = true } (steps, when given, not empty)");
                        return None;
                    }
                }
            }
            _ => {
                self.bad(
                    span.clone(),
                    at.to_string(),
                    "a route is a string \"METHOD /path\" or a table { route, steps }",
                );
                return None;
            }
        };
        let mut route = match Route::parse(&text, steps) {
            Ok(r) => r,
            Err(e) => {
                self.bad(span.clone(), at.to_string(), &format!("{e}"));
                return None;
            }
        };
        if let Some(s) = &route.steps {
            if let Some(missing) = s.iter().find(|s| !tool_steps.contains(*s)) {
                self.bad(
                    span.clone(),
                    at.to_string(),
                    &format!("can never match: the route names step {missing:?}, which is not one of the tool's steps"),
                );
                return None;
            }
        }
        match bind_request.map(toml::Value::as_bool) {
            None => {}
            Some(Some(b)) => route.bind_request = b,
            Some(None) => {
                self.bad(
                    span.clone(),
                    format!("{at}.bind_request"),
                    "must be a boolean",
                );
                return None;
            }
        }
        if let Some(b) = bindings {
            route.details = self.bindings(b, &route, declared, at, span)?;
        }
        Some(route)
    }

    /// A route table's `details = { <variable> = "<type>.<field>", ... }`:
    /// each key a variable of the route, each value a declared `string` or
    /// `integer` field of one of the tool's `authorization_details` types
    /// (type and field names may hold `.`, so the one split that names a
    /// declared field is taken). `None` after reporting every bad entry.
    fn bindings(
        &mut self,
        v: &toml::Value,
        route: &Route,
        declared: Option<&BTreeMap<String, DetailType>>,
        at: &str,
        span: Range<usize>,
    ) -> Option<Vec<DetailBinding>> {
        let Some(tbl) = v.as_table().filter(|t| !t.is_empty()) else {
            self.bad(span, format!("{at}.details"), "must be a table { <route variable> = \"<type>.<field>\", ... } naming at least one variable");
            return None;
        };
        let mut out = Vec::new();
        let mut ok = true;
        for (var, target) in tbl {
            let key = format!("{at}.details.{var}");
            if !route.has_variable(var) {
                self.bad(
                    span.clone(),
                    key,
                    "names no variable of the route; bind the route's own {variables}",
                );
                ok = false;
                continue;
            }
            let Some(target) = target.as_str() else {
                self.bad(span.clone(), key, "must be a string \"<type>.<field>\"");
                ok = false;
                continue;
            };
            let found: Vec<(&String, &DetailField)> = target
                .match_indices('.')
                .filter_map(|(i, _)| {
                    let (ty, field) = (&target[..i], &target[i + 1..]);
                    declared?
                        .get_key_value(ty)
                        .and_then(|(t, d)| d.fields.get(field).map(|f| (t, f)))
                })
                .collect();
            match found[..] {
                [(ty, f)] if f.kind != FieldKind::Strings => out.push(DetailBinding {
                    var: var.clone(),
                    ty: ty.clone(),
                    field: target[ty.len() + 1..].to_string(),
                }),
                [_] => {
                    self.bad(span.clone(), key, "binds a list field (kind = \"strings\"): a route variable can only equal a string or integer field");
                    ok = false;
                }
                [] => {
                    self.bad(span.clone(), key, &format!("{target:?} is not a declared field of the tool: write \"<type>.<field>\" naming a field under authorization_details"));
                    ok = false;
                }
                _ => {
                    self.bad(span.clone(), key, &format!("{target:?} names more than one declared field (type and field names both hold '.'); rename one"));
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }
}
