//! Owns decoding of the Kubernetes protobuf wire format for the few kinds
//! Go clients send that way: client-go's typed clients (Helm's release
//! Secrets, `kubectl create namespace|configmap|secret`) write protobuf
//! bodies and `DeleteOptions`. A body is the magic `k8s\0` followed by a
//! `runtime.Unknown` {typeMeta{apiVersion, kind}, raw}; `raw` is the typed
//! message, decoded here into the same JSON the JSON endpoints accept.
//! Services, ServiceAccounts, ResourceQuotas, PriorityClasses,
//! PodDisruptionBudgets, Deployments, CertificateSigningRequests and the
//! RBAC kinds (`kubectl create
//! service|serviceaccount|quota|priorityclass|pdb|deployment|clusterrole|
//! role|rolebinding|clusterrolebinding`, `kubectl certificate
//! approve|deny`) are decoded through field tables
//! (`Table`) taken from Kubernetes' `generated.proto`; Go writes every
//! non-pointer field, so empty strings, zeros and false are dropped as
//! unset; a set field a table does not know is 415, never dropped. Other
//! kinds get 415, which names JSON as the way to send them.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::status::ApiError;

/// One protobuf field: number and value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn bad(what: &str) -> ApiError {
    ApiError::bad_request(format!(
        "malformed protobuf body ({what}): send application/json instead"
    ))
}

fn varint(b: &[u8], pos: &mut usize) -> Result<u64, ApiError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos).ok_or_else(|| bad("truncated varint"))?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("varint too long"))
}

fn fields(b: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ApiError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < b.len() {
        let key = varint(b, &mut pos)?;
        let (num, wire) = (key >> 3, key & 7);
        let f = match wire {
            0 => Field::Varint(varint(b, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(b, &mut pos)?).map_err(|_| bad("length"))?;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= b.len())
                    .ok_or_else(|| bad("truncated field"))?;
                let s = &b[pos..end];
                pos = end;
                Field::Bytes(s)
            }
            1 => {
                pos += 8;
                Field::Fixed
            }
            5 => {
                pos += 4;
                Field::Fixed
            }
            _ => return Err(bad("unsupported wire type")),
        };
        if pos > b.len() {
            return Err(bad("truncated fixed field"));
        }
        out.push((num, f));
    }
    Ok(out)
}

fn string(f: &Field<'_>) -> Result<String, ApiError> {
    match f {
        Field::Bytes(b) => String::from_utf8(b.to_vec()).map_err(|_| bad("string is not UTF-8")),
        _ => Err(bad("expected a string")),
    }
}

fn bytes<'a>(f: &Field<'a>) -> Result<&'a [u8], ApiError> {
    match f {
        Field::Bytes(b) => Ok(b),
        _ => Err(bad("expected bytes")),
    }
}

fn int(f: &Field<'_>) -> Result<i64, ApiError> {
    match f {
        Field::Varint(v) => Ok(*v as i64),
        _ => Err(bad("expected an integer")),
    }
}

/// A map entry {key = 1, value = 2}; `as_b64` for `map<string, bytes>`.
fn map_entry(f: &Field<'_>, as_b64: bool) -> Result<(String, Value), ApiError> {
    let mut k = String::new();
    let mut v = Value::String(String::new());
    for (n, x) in fields(bytes(f)?)? {
        match n {
            1 => k = string(&x)?,
            2 if as_b64 => v = json!(base64::engine::general_purpose::STANDARD.encode(bytes(&x)?)),
            2 => v = json!(string(&x)?),
            _ => {}
        }
    }
    Ok((k, v))
}

fn time(f: &Field<'_>) -> Result<Value, ApiError> {
    let mut secs = 0;
    for (n, x) in fields(bytes(f)?)? {
        if n == 1 {
            secs = int(&x)?;
        }
    }
    Ok(chrono::DateTime::from_timestamp(secs, 0)
        .filter(|_| secs != 0)
        .map(|t| json!(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
        .unwrap_or(Value::Null))
}

fn owner_ref(f: &Field<'_>) -> Result<Value, ApiError> {
    let mut o = Map::new();
    for (n, x) in fields(bytes(f)?)? {
        let (k, v) = match n {
            1 => ("kind", json!(string(&x)?)),
            3 => ("name", json!(string(&x)?)),
            4 => ("uid", json!(string(&x)?)),
            5 => ("apiVersion", json!(string(&x)?)),
            6 => ("controller", json!(int(&x)? != 0)),
            7 => ("blockOwnerDeletion", json!(int(&x)? != 0)),
            _ => continue,
        };
        o.insert(k.into(), v);
    }
    Ok(Value::Object(o))
}

fn object_meta(b: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut owners = Vec::new();
    let mut finalizers = Vec::new();
    // Go encodes every non-pointer field, so "" and 0 mean "unset".
    let mut put = |k: &str, v: Value| {
        let empty = v.as_str() == Some("") || v.as_i64() == Some(0) || v.is_null();
        if !empty {
            m.insert(k.to_string(), v);
        }
    };
    for (n, x) in fields(b)? {
        match n {
            1 => put("name", json!(string(&x)?)),
            2 => put("generateName", json!(string(&x)?)),
            3 => put("namespace", json!(string(&x)?)),
            5 => put("uid", json!(string(&x)?)),
            6 => put("resourceVersion", json!(string(&x)?)),
            7 => put("generation", json!(int(&x)?)),
            8 => put("creationTimestamp", time(&x)?),
            11 => {
                let (k, v) = map_entry(&x, false)?;
                labels.insert(k, v);
            }
            12 => {
                let (k, v) = map_entry(&x, false)?;
                annotations.insert(k, v);
            }
            13 => owners.push(owner_ref(&x)?),
            14 => finalizers.push(json!(string(&x)?)),
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !owners.is_empty() {
        m.insert("ownerReferences".into(), Value::Array(owners));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(m))
}

fn typed(api_version: &str, kind: &str, raw: &[u8]) -> Result<Value, ApiError> {
    let mut obj = json!({"apiVersion": api_version, "kind": kind});
    let mut data = Map::new();
    let mut other = Map::new();
    for (n, x) in fields(raw)? {
        if n == 1 {
            obj["metadata"] = object_meta(bytes(&x)?)?;
            continue;
        }
        match (kind, n) {
            ("Secret", 2) | ("ConfigMap", 3) => {
                let (k, v) = map_entry(&x, true)?;
                let field = if kind == "Secret" {
                    "data"
                } else {
                    "binaryData"
                };
                other.entry(field).or_insert_with(|| json!({}))[k] = v;
            }
            ("Secret", 3) => {
                let t = string(&x)?;
                if !t.is_empty() {
                    obj["type"] = json!(t);
                }
            }
            ("Secret", 4) | ("ConfigMap", 2) => {
                let (k, v) = map_entry(&x, false)?;
                if kind == "Secret" {
                    other.entry("stringData").or_insert_with(|| json!({}))[k] = v;
                } else {
                    data.insert(k, v);
                }
            }
            ("Secret", 5) | ("ConfigMap", 4) => obj["immutable"] = json!(int(&x)? != 0),
            ("Namespace", 2) => {
                let fins: Vec<Value> = fields(bytes(&x)?)?
                    .iter()
                    .filter(|(n, _)| *n == 1)
                    .map(|(_, f)| string(f).map(Value::String))
                    .collect::<Result<_, _>>()?;
                obj["spec"] = json!({"finalizers": fins});
            }
            _ => {}
        }
    }
    if !data.is_empty() {
        obj["data"] = Value::Object(data);
    }
    for (k, v) in other {
        obj[k] = v;
    }
    Ok(obj)
}

fn unknown(body: &[u8]) -> Result<(String, String, &[u8]), ApiError> {
    let inner = body
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| bad("missing the k8s magic prefix"))?;
    let (mut av, mut kind, mut raw): (String, String, &[u8]) = (String::new(), String::new(), &[]);
    for (n, x) in fields(inner)? {
        match n {
            1 => {
                for (tn, tx) in fields(bytes(&x)?)? {
                    match tn {
                        1 => av = string(&tx)?,
                        2 => kind = string(&tx)?,
                        _ => {}
                    }
                }
            }
            2 => raw = bytes(&x)?,
            _ => {}
        }
    }
    Ok((av, kind, raw))
}

/// How one protobuf field becomes JSON.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    /// A pointer integer (`*int32`): written only when set, so 0 counts.
    OptInt,
    Bool,
    /// `repeated string`.
    Strs,
    /// `map<string, string>`.
    StrMap,
    /// `IntOrString` {type = 1, intVal = 2, strVal = 3}.
    IntOrStr,
    /// `ObjectMeta`.
    Meta,
    Msg(Table),
    /// `repeated` message.
    Msgs(Table),
    /// `map<string, Quantity>` (a Quantity is {string = 1}).
    QuantityMap,
    /// `bytes` (base64 in JSON).
    B64,
    /// `metav1.Time`.
    Time,
    /// `map<string, ExtraValue>` (an ExtraValue is {repeated string = 1}).
    ExtraMap,
    /// Read-only here (a status the server computes): not decoded.
    Skip,
}

/// A message: its fields as (number, JSON name, type).
type Table = &'static [(u64, &'static str, Ty)];

const SERVICE_PORT: Table = &[
    (1, "name", Ty::Str),
    (2, "protocol", Ty::Str),
    (3, "port", Ty::Int),
    (4, "targetPort", Ty::IntOrStr),
    (5, "nodePort", Ty::Int),
    (6, "appProtocol", Ty::Str),
];
const SERVICE_SPEC: Table = &[
    (1, "ports", Ty::Msgs(SERVICE_PORT)),
    (2, "selector", Ty::StrMap),
    (3, "clusterIP", Ty::Str),
    (4, "type", Ty::Str),
    (5, "externalIPs", Ty::Strs),
    (7, "sessionAffinity", Ty::Str),
    (8, "loadBalancerIP", Ty::Str),
    (9, "loadBalancerSourceRanges", Ty::Strs),
    (10, "externalName", Ty::Str),
    (11, "externalTrafficPolicy", Ty::Str),
    (12, "healthCheckNodePort", Ty::Int),
    (13, "publishNotReadyAddresses", Ty::Bool),
    (17, "ipFamilyPolicy", Ty::Str),
    (18, "clusterIPs", Ty::Strs),
    (19, "ipFamilies", Ty::Strs),
    (20, "allocateLoadBalancerNodePorts", Ty::Bool),
    (21, "loadBalancerClass", Ty::Str),
    (22, "internalTrafficPolicy", Ty::Str),
    (23, "trafficDistribution", Ty::Str),
];
const SERVICE: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "spec", Ty::Msg(SERVICE_SPEC)),
    (3, "status", Ty::Skip),
];
const LOCAL_OBJECT_REFERENCE: Table = &[(1, "name", Ty::Str)];
const OBJECT_REFERENCE: Table = &[
    (1, "kind", Ty::Str),
    (2, "namespace", Ty::Str),
    (3, "name", Ty::Str),
    (4, "uid", Ty::Str),
    (5, "apiVersion", Ty::Str),
    (6, "resourceVersion", Ty::Str),
    (7, "fieldPath", Ty::Str),
];
const SERVICE_ACCOUNT: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "secrets", Ty::Msgs(OBJECT_REFERENCE)),
    (3, "imagePullSecrets", Ty::Msgs(LOCAL_OBJECT_REFERENCE)),
    (4, "automountServiceAccountToken", Ty::Bool),
];
const PRIORITY_CLASS: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "value", Ty::Int),
    (3, "globalDefault", Ty::Bool),
    (4, "description", Ty::Str),
    (5, "preemptionPolicy", Ty::Str),
];
const PDB_SPEC: Table = &[
    (1, "minAvailable", Ty::IntOrStr),
    (2, "selector", Ty::Msg(LABEL_SELECTOR)),
    (3, "maxUnavailable", Ty::IntOrStr),
    (4, "unhealthyPodEvictionPolicy", Ty::Str),
];
const PDB: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "spec", Ty::Msg(PDB_SPEC)),
    (3, "status", Ty::Skip),
];
const CONTAINER_PORT: Table = &[
    (1, "name", Ty::Str),
    (2, "hostPort", Ty::Int),
    (3, "containerPort", Ty::Int),
    (4, "protocol", Ty::Str),
    (5, "hostIP", Ty::Str),
];
const ENV_VAR: Table = &[(1, "name", Ty::Str), (2, "value", Ty::Str)];
const RESOURCES: Table = &[
    (1, "limits", Ty::QuantityMap),
    (2, "requests", Ty::QuantityMap),
];
const CONTAINER: Table = &[
    (1, "name", Ty::Str),
    (2, "image", Ty::Str),
    (3, "command", Ty::Strs),
    (4, "args", Ty::Strs),
    (5, "workingDir", Ty::Str),
    (6, "ports", Ty::Msgs(CONTAINER_PORT)),
    (7, "env", Ty::Msgs(ENV_VAR)),
    (8, "resources", Ty::Msg(RESOURCES)),
    (13, "terminationMessagePath", Ty::Str),
    (14, "imagePullPolicy", Ty::Str),
    (16, "stdin", Ty::Bool),
    (17, "stdinOnce", Ty::Bool),
    (18, "tty", Ty::Bool),
    (20, "terminationMessagePolicy", Ty::Str),
];
const POD_SPEC: Table = &[
    (2, "containers", Ty::Msgs(CONTAINER)),
    (3, "restartPolicy", Ty::Str),
    (4, "terminationGracePeriodSeconds", Ty::OptInt),
    (6, "dnsPolicy", Ty::Str),
    (7, "nodeSelector", Ty::StrMap),
    (8, "serviceAccountName", Ty::Str),
    (9, "serviceAccount", Ty::Str),
    (10, "nodeName", Ty::Str),
    (11, "hostNetwork", Ty::Bool),
    (12, "hostPID", Ty::Bool),
    (13, "hostIPC", Ty::Bool),
    (16, "hostname", Ty::Str),
    (17, "subdomain", Ty::Str),
    (19, "schedulerName", Ty::Str),
    (20, "initContainers", Ty::Msgs(CONTAINER)),
    (21, "automountServiceAccountToken", Ty::Bool),
    (24, "priorityClassName", Ty::Str),
    (25, "priority", Ty::OptInt),
];
const POD_TEMPLATE_SPEC: Table = &[(1, "metadata", Ty::Meta), (2, "spec", Ty::Msg(POD_SPEC))];
const ROLLING_UPDATE: Table = &[
    (1, "maxUnavailable", Ty::IntOrStr),
    (2, "maxSurge", Ty::IntOrStr),
];
const DEPLOYMENT_STRATEGY: Table = &[
    (1, "type", Ty::Str),
    (2, "rollingUpdate", Ty::Msg(ROLLING_UPDATE)),
];
const DEPLOYMENT_SPEC: Table = &[
    (1, "replicas", Ty::OptInt),
    (2, "selector", Ty::Msg(LABEL_SELECTOR)),
    (3, "template", Ty::Msg(POD_TEMPLATE_SPEC)),
    (4, "strategy", Ty::Msg(DEPLOYMENT_STRATEGY)),
    (5, "minReadySeconds", Ty::Int),
    (6, "revisionHistoryLimit", Ty::OptInt),
    (7, "paused", Ty::Bool),
    (9, "progressDeadlineSeconds", Ty::OptInt),
];
const DEPLOYMENT: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "spec", Ty::Msg(DEPLOYMENT_SPEC)),
    (3, "status", Ty::Skip),
];
const QUOTA_SPEC: Table = &[(1, "hard", Ty::QuantityMap), (2, "scopes", Ty::Strs)];
const QUOTA: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "spec", Ty::Msg(QUOTA_SPEC)),
    (3, "status", Ty::Skip),
];
const POLICY_RULE: Table = &[
    (1, "verbs", Ty::Strs),
    (2, "apiGroups", Ty::Strs),
    (3, "resources", Ty::Strs),
    (4, "resourceNames", Ty::Strs),
    (5, "nonResourceURLs", Ty::Strs),
];
const LABEL_REQUIREMENT: Table = &[
    (1, "key", Ty::Str),
    (2, "operator", Ty::Str),
    (3, "values", Ty::Strs),
];
const LABEL_SELECTOR: Table = &[
    (1, "matchLabels", Ty::StrMap),
    (2, "matchExpressions", Ty::Msgs(LABEL_REQUIREMENT)),
];
const AGGREGATION_RULE: Table = &[(1, "clusterRoleSelectors", Ty::Msgs(LABEL_SELECTOR))];
const ROLE: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "rules", Ty::Msgs(POLICY_RULE)),
    (3, "aggregationRule", Ty::Msg(AGGREGATION_RULE)),
];
const SUBJECT: Table = &[
    (1, "kind", Ty::Str),
    (2, "apiGroup", Ty::Str),
    (3, "name", Ty::Str),
    (4, "namespace", Ty::Str),
];
const ROLE_REF: Table = &[
    (1, "apiGroup", Ty::Str),
    (2, "kind", Ty::Str),
    (3, "name", Ty::Str),
];
const BINDING: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "subjects", Ty::Msgs(SUBJECT)),
    (3, "roleRef", Ty::Msg(ROLE_REF)),
];

const CSR_CONDITION: Table = &[
    (1, "type", Ty::Str),
    (6, "status", Ty::Str),
    (2, "reason", Ty::Str),
    (3, "message", Ty::Str),
    (4, "lastUpdateTime", Ty::Time),
    (5, "lastTransitionTime", Ty::Time),
];
const CSR_SPEC: Table = &[
    (1, "request", Ty::B64),
    (7, "signerName", Ty::Str),
    (8, "expirationSeconds", Ty::OptInt),
    (5, "usages", Ty::Strs),
    (2, "username", Ty::Str),
    (3, "uid", Ty::Str),
    (4, "groups", Ty::Strs),
    (6, "extra", Ty::ExtraMap),
];
const CSR_STATUS: Table = &[
    (1, "conditions", Ty::Msgs(CSR_CONDITION)),
    (2, "certificate", Ty::B64),
];
/// `certificates.k8s.io/v1` CertificateSigningRequest (what `kubectl
/// certificate approve|deny` sends to `approval`).
const CSR: Table = &[
    (1, "metadata", Ty::Meta),
    (2, "spec", Ty::Msg(CSR_SPEC)),
    (3, "status", Ty::Msg(CSR_STATUS)),
];

/// A message decoded through its table; unset (zero) scalars are left out.
/// A set field the table does not know is refused (415), never dropped.
fn message(b: &[u8], table: Table) -> Result<Map<String, Value>, ApiError> {
    let mut out = Map::new();
    for (n, x) in fields(b)? {
        let Some((_, name, ty)) = table.iter().find(|(num, _, _)| *num == n) else {
            let unset = match &x {
                Field::Varint(v) => *v == 0,
                Field::Bytes(b) => b.is_empty(),
                Field::Fixed => false,
            };
            if unset {
                continue;
            }
            return Err(ApiError::unsupported_media(format!(
                "protobuf field {n} of this object is not decoded here: send application/json"
            )));
        };
        let name = (*name).to_string();
        match ty {
            Ty::Str => {
                let v = string(&x)?;
                if !v.is_empty() {
                    out.insert(name, json!(v));
                }
            }
            Ty::Int => {
                let v = int(&x)?;
                if v != 0 {
                    out.insert(name, json!(v));
                }
            }
            Ty::OptInt => {
                out.insert(name, json!(int(&x)?));
            }
            Ty::Bool => {
                out.insert(name, json!(int(&x)? != 0));
            }
            Ty::Strs => {
                let a = out.entry(name).or_insert_with(|| json!([]));
                if let Some(a) = a.as_array_mut() {
                    a.push(json!(string(&x)?));
                }
            }
            Ty::StrMap => {
                let (k, v) = map_entry(&x, false)?;
                let m = out.entry(name).or_insert_with(|| json!({}));
                m[k] = v;
            }
            Ty::IntOrStr => {
                let mut is_str = false;
                let (mut i, mut st) = (0, String::new());
                for (n, f) in fields(bytes(&x)?)? {
                    match n {
                        1 => is_str = int(&f)? == 1,
                        2 => i = int(&f)?,
                        3 => st = string(&f)?,
                        _ => {}
                    }
                }
                out.insert(name, if is_str { json!(st) } else { json!(i) });
            }
            Ty::Meta => {
                out.insert(name, object_meta(bytes(&x)?)?);
            }
            Ty::Msg(t) => {
                out.insert(name, Value::Object(message(bytes(&x)?, t)?));
            }
            Ty::Msgs(t) => {
                let item = Value::Object(message(bytes(&x)?, t)?);
                let a = out.entry(name).or_insert_with(|| json!([]));
                if let Some(a) = a.as_array_mut() {
                    a.push(item);
                }
            }
            Ty::QuantityMap => {
                let (mut k, mut q) = (String::new(), String::new());
                for (n, f) in fields(bytes(&x)?)? {
                    match n {
                        1 => k = string(&f)?,
                        2 => {
                            for (qn, qf) in fields(bytes(&f)?)? {
                                if qn == 1 {
                                    q = string(&qf)?;
                                }
                            }
                        }
                        _ => {}
                    }
                }
                let m = out.entry(name).or_insert_with(|| json!({}));
                m[k] = json!(q);
            }
            Ty::B64 => {
                let b = bytes(&x)?;
                if !b.is_empty() {
                    out.insert(
                        name,
                        json!(base64::engine::general_purpose::STANDARD.encode(b)),
                    );
                }
            }
            Ty::Time => {
                out.insert(name, time(&x)?);
            }
            Ty::ExtraMap => {
                let (mut k, mut items) = (String::new(), Vec::new());
                for (n, f) in fields(bytes(&x)?)? {
                    match n {
                        1 => k = string(&f)?,
                        2 => {
                            for (vn, vf) in fields(bytes(&f)?)? {
                                if vn == 1 {
                                    items.push(json!(string(&vf)?));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                let m = out.entry(name).or_insert_with(|| json!({}));
                m[k] = json!(items);
            }
            Ty::Skip => {}
        }
    }
    Ok(out)
}

/// The field table of a kind decoded through tables.
fn table_of(api_version: &str, kind: &str) -> Option<Table> {
    Some(match (api_version, kind) {
        ("v1", "Service") => SERVICE,
        ("rbac.authorization.k8s.io/v1", "ClusterRole" | "Role") => ROLE,
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding" | "RoleBinding") => BINDING,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "ResourceQuota") => QUOTA,
        ("scheduling.k8s.io/v1", "PriorityClass") => PRIORITY_CLASS,
        ("policy/v1", "PodDisruptionBudget") => PDB,
        ("apps/v1", "Deployment") => DEPLOYMENT,
        ("certificates.k8s.io/v1", "CertificateSigningRequest") => CSR,
        _ => return None,
    })
}

/// Decodes a protobuf object body into JSON.
pub(crate) fn decode_object(body: &[u8]) -> Result<Value, ApiError> {
    let (av, kind, raw) = unknown(body)?;
    if let Some(table) = table_of(&av, &kind) {
        let mut obj = message(raw, table)?;
        obj.insert("apiVersion".into(), json!(av));
        obj.insert("kind".into(), json!(kind));
        return Ok(Value::Object(obj));
    }
    match (av.as_str(), kind.as_str()) {
        ("v1", "Secret" | "ConfigMap" | "Namespace") => typed(&av, &kind, raw),
        ("authentication.k8s.io/v1", "TokenRequest") => token_request(raw),
        _ => Err(ApiError::unsupported_media(format!(
            "protobuf bodies are accepted for v1 Secret, ConfigMap, Namespace, Service, ServiceAccount, ResourceQuota, TokenRequest, PriorityClass, PodDisruptionBudget, Deployment, CertificateSigningRequest and the RBAC kinds only, not {av} {kind}: send application/json"
        ))),
    }
}

/// A TokenRequest (what `kubectl create token` sends): its `spec`
/// {audiences = 1, boundObjectRef = 3 {kind, apiVersion, name, uid},
/// expirationSeconds = 4}.
fn token_request(raw: &[u8]) -> Result<Value, ApiError> {
    let mut spec = Map::new();
    for (n, x) in fields(raw)? {
        if n != 2 {
            continue;
        }
        for (sn, sx) in fields(bytes(&x)?)? {
            match sn {
                1 => {
                    let a = spec.entry("audiences").or_insert_with(|| json!([]));
                    if let Some(a) = a.as_array_mut() {
                        a.push(json!(string(&sx)?));
                    }
                }
                3 => {
                    let mut r = Map::new();
                    for (rn, rx) in fields(bytes(&sx)?)? {
                        let k = match rn {
                            1 => "kind",
                            2 => "apiVersion",
                            3 => "name",
                            4 => "uid",
                            _ => continue,
                        };
                        r.insert(k.into(), json!(string(&rx)?));
                    }
                    spec.insert("boundObjectRef".into(), Value::Object(r));
                }
                4 => drop(spec.insert("expirationSeconds".into(), json!(int(&sx)?))),
                _ => {}
            }
        }
    }
    Ok(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}))
}

/// Decodes the `spec` of a protobuf access review (`SelfSubjectAccessReview`,
/// `SubjectAccessReview`, `SelfSubjectRulesReview`; what kubectl sends for
/// `auth can-i`) into the JSON form `{"spec": {...}}`.
pub(crate) fn decode_review(body: &[u8]) -> Result<Value, ApiError> {
    let (_, kind, raw) = unknown(body)?;
    let attrs = |b: &[u8], names: &[&str]| -> Result<Value, ApiError> {
        let mut o = Map::new();
        for (n, x) in fields(b)? {
            if let Some(name) = usize::try_from(n)
                .ok()
                .and_then(|i| names.get(i.wrapping_sub(1)))
            {
                o.insert((*name).into(), json!(string(&x)?));
            }
        }
        Ok(Value::Object(o))
    };
    let mut spec = Map::new();
    for (n, x) in fields(raw)? {
        if n != 2 {
            continue;
        }
        for (sn, sx) in fields(bytes(&x)?)? {
            match (kind.as_str(), sn) {
                ("SelfSubjectRulesReview", 1) => {
                    drop(spec.insert("namespace".into(), json!(string(&sx)?)))
                }
                ("SelfSubjectRulesReview", _) => {}
                (_, 1) => drop(spec.insert(
                    "resourceAttributes".into(),
                    attrs(
                        bytes(&sx)?,
                        &[
                            "namespace",
                            "verb",
                            "group",
                            "version",
                            "resource",
                            "subresource",
                            "name",
                        ],
                    )?,
                )),
                (_, 2) => drop(spec.insert(
                    "nonResourceAttributes".into(),
                    attrs(bytes(&sx)?, &["path", "verb"])?,
                )),
                (_, 3) => drop(spec.insert("user".into(), json!(string(&sx)?))),
                (_, 4) => {
                    let g = spec.entry("groups").or_insert_with(|| json!([]));
                    if let Some(a) = g.as_array_mut() {
                        a.push(json!(string(&sx)?));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(json!({"spec": spec}))
}

/// Decodes protobuf `DeleteOptions` into its JSON form.
pub(crate) fn decode_delete_options(body: &[u8]) -> Result<Value, ApiError> {
    let (_, _, raw) = unknown(body)?;
    let mut o = Map::new();
    for (n, x) in fields(raw)? {
        match n {
            1 => drop(o.insert("gracePeriodSeconds".into(), json!(int(&x)?))),
            2 => {
                let mut pre = Map::new();
                for (pn, px) in fields(bytes(&x)?)? {
                    match pn {
                        1 => drop(pre.insert("uid".into(), json!(string(&px)?))),
                        2 => drop(pre.insert("resourceVersion".into(), json!(string(&px)?))),
                        _ => {}
                    }
                }
                o.insert("preconditions".into(), Value::Object(pre));
            }
            3 => drop(o.insert("orphanDependents".into(), json!(int(&x)? != 0))),
            4 => drop(o.insert("propagationPolicy".into(), json!(string(&x)?))),
            _ => {}
        }
    }
    Ok(Value::Object(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ld(num: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![(num << 3) | 2, body.len() as u8];
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn decodes_a_secret_like_helm_sends_it() {
        let mut meta = ld(1, b"sh.helm.release.v1.hm.v1");
        meta.extend(ld(3, b"default"));
        let mut entry = ld(1, b"status");
        entry.extend(ld(2, b"deployed"));
        meta.extend(ld(11, &entry));
        let mut raw = ld(1, &meta);
        let mut d = ld(1, b"release");
        d.extend(ld(2, b"\x00\x01"));
        raw.extend(ld(2, &d));
        raw.extend(ld(3, b"helm.sh/release.v1"));
        let mut tm = ld(1, b"v1");
        tm.extend(ld(2, b"Secret"));
        let mut body = b"k8s\0".to_vec();
        body.extend(ld(1, &tm));
        body.extend(ld(2, &raw));
        let v = decode_object(&body).expect("decodes");
        assert_eq!(v["metadata"]["name"], "sh.helm.release.v1.hm.v1");
        assert_eq!(v["metadata"]["labels"]["status"], "deployed");
        assert_eq!(v["type"], "helm.sh/release.v1");
        assert_eq!(v["data"]["release"], "AAE=");
    }

    #[test]
    fn truncated_bodies_are_errors_not_panics() {
        assert!(decode_object(b"k8s\0\x0a\x05ab").is_err());
        assert!(decode_object(b"nope").is_err());
        assert!(decode_object(b"k8s\0\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff").is_err());
    }
}
