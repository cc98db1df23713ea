-- prelude.lua: the generator's side of the template protocol.
--
-- Runs inside the sandboxed Lua state that gen/sandbox.c creates, before the
-- template. It walks a template's parameter space, names variants, encodes
-- parameters as JSON and wraps emitted source in the generator's header.
-- Templates never see this file's locals: they run in their own environment
-- that holds only the safe libraries and the `gen` helper table below.

local prelude = {}

-- Helpers that templates may use (exposed as the global `gen`).
local helpers = {}

-- Replaces ${name} in text with tostring(vars[name]); an unknown name is an
-- error at the caller's line, so typos in templates are caught at once.
function helpers.subst(text, vars)
  return (text:gsub("%${([%w_]+)}", function(key)
    local v = vars[key]
    if v == nil then error("subst: no value for ${" .. key .. "}", 4) end
    return tostring(v)
  end))
end

-- Indents every non-empty line of text by n spaces.
function helpers.indent(text, n)
  local pad = string.rep(" ", n)
  return (text:gsub("([^\n]*)(\n?)", function(line, nl)
    if line == "" then return nl end
    return pad .. line .. nl
  end))
end

-- Concatenates the results of f(i) for i = 1..n, each followed by sep.
function helpers.each(n, f, sep)
  local out = {}
  for i = 1, n do out[#out + 1] = f(i) end
  return table.concat(out, sep or "")
end

helpers.version = GENERATOR_VERSION

prelude.helpers = helpers

-- Checks the table a template returned, so mistakes are reported clearly.
function prelude.validate(T, file)
  local function need(field, kind)
    if type(T[field]) ~= kind then
      error(file .. ": template must define '" .. field .. "' as a " .. kind, 0)
    end
  end
  if type(T) ~= "table" then error(file .. ": template must return a table", 0) end
  need("backend", "string"); need("op", "string"); need("params", "table")
  need("id", "function"); need("emit", "function")
  if T.specialize ~= nil and type(T.specialize) ~= "function" then
    error(file .. ": 'specialize' must be a function or absent", 0)
  end
  for i, p in ipairs(T.params) do
    if type(p.name) ~= "string" or type(p.values) ~= "table" or #p.values == 0 then
      error(file .. ": params[" .. i .. "] needs a name and a non-empty values list", 0)
    end
    if p.launch ~= nil and type(p.launch) ~= "boolean" then
      error(file .. ": params[" .. i .. "].launch must be true, false or absent", 0)
    end
  end
end

-- Every combination of parameter values, in declaration order, that passes
-- the template's constraint function. Walked once per template: a space
-- can hold thousands of combinations and every emit or applies looks up
-- one variant by id.
local spaces = setmetatable({}, { __mode = "k" })

function prelude.enumerate(T)
  local cached = spaces[T]
  if cached then return cached.list end
  local list = prelude.walk(T)
  local by_id = {}
  for _, p in ipairs(list) do by_id[T.id(p)] = p end
  spaces[T] = { list = list, by_id = by_id }
  return list
end

function prelude.walk(T)
  local out, cur = {}, {}
  local function walk(i)
    if i > #T.params then
      local p = {}
      for k, v in pairs(cur) do p[k] = v end
      if not T.constraint or T.constraint(p) then out[#out + 1] = p end
      return
    end
    local spec = T.params[i]
    for _, v in ipairs(spec.values) do
      cur[spec.name] = v
      walk(i + 1)
    end
    cur[spec.name] = nil
  end
  walk(1)
  return out
end

local function json_value(v)
  if type(v) == "string" then
    return '"' .. v:gsub('[%c"\\]', function(c)
      return string.format("\\u%04x", c:byte())
    end) .. '"'
  elseif type(v) == "boolean" then
    return v and "true" or "false"
  elseif math.type(v) == "integer" then
    return string.format("%d", v)
  elseif type(v) == "number" then
    return string.format("%.17g", v)
  end
  error("parameter values must be strings, numbers or booleans", 0)
end

-- Flat JSON object of the parameters plus the launch data, keys sorted.
function prelude.params_json(T, p)
  local all = {}
  for k, v in pairs(p) do all[k] = v end
  if T.launch then
    for k, v in pairs(T.launch(p)) do all[k] = v end
  end
  local keys = {}
  for k in pairs(all) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = json_value(k) .. ":" .. json_value(all[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- The list the host turns into argen_variant records.
function prelude.list(T)
  local out = {}
  for _, p in ipairs(prelude.enumerate(T)) do
    out[#out + 1] = { id = T.id(p), json = prelude.params_json(T, p) }
  end
  return out
end

-- A copy, so that a template that writes into its parameters cannot
-- change the cached space.
function prelude.find(T, id)
  prelude.enumerate(T)
  local p = spaces[T].by_id[id]
  if not p then return nil end
  local copy = {}
  for k, v in pairs(p) do copy[k] = v end
  return copy
end

-- Source of one variant with the header every generated file carries.
--
-- A parameter marked `launch = true` in T.params (the CPU templates'
-- threads) is a launch parameter: the runtime reads it from the variant's
-- parameters, so neither the source nor the kernel name may depend on it.
-- Variants that differ only in launch parameters then have one source, one
-- build key and one binary. Their header names the kernel and the other
-- parameters instead of the variant id, which names the launch parameters.
--
-- spec, when given, is what prelude.specialize returned for a problem: the
-- source may then fix those facts of the problem (T.emit(p, facts)), and
-- says so in its header.
function prelude.emit(T, file, id, spec)
  local p = prelude.find(T, id)
  if not p then error("no variant '" .. id .. "' in " .. file, 0) end
  local facts = nil
  if spec and spec ~= "" then
    facts = {}
    for k, v in spec:gmatch("([%w_]+)=(%-?%d+)") do facts[k] = tonumber(v) end
  end
  local body, kernel = T.emit(p, facts)
  if type(body) ~= "string" or type(kernel) ~= "string" then
    error(file .. ": emit must return the source and the kernel name", 0)
  end
  local names, launch = {}, {}
  for _, spec in ipairs(T.params) do
    if spec.launch then
      launch[#launch + 1] = spec.name
    else
      names[#names + 1] = spec.name .. "=" .. tostring(p[spec.name])
    end
  end
  if facts then names[#names + 1] = "specialized for " .. spec end
  local header
  if #launch == 0 then
    header = string.format(
      "/* Generated by attnres-gen %s from %s. Do not edit.\n" ..
      " * variant %s: %s */\n", GENERATOR_VERSION, file, id,
      table.concat(names, " "))
  else
    header = string.format(
      "/* Generated by attnres-gen %s from %s. Do not edit.\n" ..
      " * kernel %s: %s (%s: set at launch) */\n", GENERATOR_VERSION, file, kernel,
      table.concat(names, " "), table.concat(launch, ", "))
  end
  return header .. body, kernel, prelude.params_json(T, p)
end

function prelude.applies(T, id, problem, device)
  local p = prelude.find(T, id)
  if not p then error("no variant '" .. id .. "'", 0) end
  if not T.applies then return true end
  local ok, why = T.applies(p, problem, device)
  return ok and true or false, why
end

-- Whether the tuner may leave variant id out of a problem although it
-- applies: a reason string when the template's T.prune says the variant
-- cannot win there (a cost model: its traffic, or where it was measured to
-- lose), nil when it is to be tuned. The tuner honours it unless told not
-- to (`attnres tune --no-prune`) and lists it (`--explain-pruning`).
function prelude.prune(T, id, problem, device)
  local p = prelude.find(T, id)
  if not p then error("no variant '" .. id .. "'", 0) end
  if not T.prune then return nil end
  local why = T.prune(p, problem, device)
  if why ~= nil and type(why) ~= "string" then
    error("prune() must return nil or a reason string, not a " .. type(why), 0)
  end
  return why
end

-- The facts of a problem that variant id's source may be specialized for
-- (T.specialize(p, problem, device) returns a table of integers, or nil),
-- as a string "name=value,..." in name order; "" when none. A specialized
-- source stays right for every problem (it keeps a general path) and is
-- only quicker to compile: the tuner keeps one source per variant and
-- specialization, so problems with the same facts share it.
function prelude.specialize(T, id, problem, device)
  local p = prelude.find(T, id)
  if not p then error("no variant '" .. id .. "'", 0) end
  if not T.specialize then return "" end
  local facts = T.specialize(p, problem, device)
  if facts == nil then return "" end
  if type(facts) ~= "table" then
    error("specialize() must return nil or a table, not a " .. type(facts), 0)
  end
  local keys = {}
  for k, v in pairs(facts) do
    if type(k) ~= "string" or not k:match("^[%w_]+$") or math.type(v) ~= "integer" then
      error("specialize() must map names to integers", 0)
    end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for i, k in ipairs(keys) do keys[i] = k .. "=" .. facts[k] end
  return table.concat(keys, ",")
end

-- The id of the template's generic variant for a dtype: the one the
-- runtime compiles in as its fallback. Templates name it in T.generic.
function prelude.generic(T, file, dtype)
  if type(T.generic) ~= "table" then error(file .. ": template has no generic variant", 0) end
  local want = {}
  for k, v in pairs(T.generic) do want[k] = v end
  want.dtype = dtype
  for _, p in ipairs(prelude.enumerate(T)) do
    local same = true
    for k, v in pairs(want) do if p[k] ~= v then same = false end end
    if same then return T.id(p) end
  end
  error(file .. ": the generic variant for " .. dtype .. " is not in the space", 0)
end

-- The id and loop step of the template's built-in kernel for one ISA level
-- ("avx512", "avx2", "sse2", "neon") and dtype: the variant T.builtin names
-- for that level, compiled into the runtime with that level's compiler
-- flags. A level's entry may hold a table under a dtype's name, whose
-- parameters replace the level's for that dtype. nil when the template
-- has none for the level.
function prelude.builtin(T, file, dtype, level)
  if type(T.builtin) ~= "table" or type(T.builtin[level]) ~= "table" then return nil end
  local want = {}
  for k, v in pairs(T.builtin[level]) do
    if type(v) ~= "table" then want[k] = v end
  end
  for k, v in pairs(T.builtin[level][dtype] or {}) do want[k] = v end
  want.dtype = dtype
  for _, p in ipairs(prelude.enumerate(T)) do
    local same = true
    for k, v in pairs(want) do if p[k] ~= v then same = false end end
    if same then
      local step = T.step and T.step(p) or p.vec * (p.unroll or 1)
      return T.id(p), step
    end
  end
  error(file .. ": the built-in variant for " .. level .. " and " .. dtype .. " is not in the space", 0)
end

return prelude
