// A sample application behind rsc-bridge, in Java 17 with com.sun.net.httpserver only
// (docs/BRIDGE.md): run it with `java App.java`. It receives stream entries as CloudEvents
// (binary or structured mode, or a batch), records each one it handled as a JSON line
// appended to APP_RECORD, and publishes through the bridge.
//
// Environment:
//   APP_PORT       port to listen on (127.0.0.1), default 8080
//   APP_RECORD     file to append one JSON line per handled entry (before answering 2xx):
//                  {entry_id, shard, key, seq, delivery_count, attempt, started_ms, finished_ms, app, mode}
//                  (mode: how the entry came, "binary", "structured" or "batch")
//   APP_HANDLE_MS  time each delivery takes (a slow application), default 0
//   APP_TOKEN      the bearer token shared with the bridge (checked on deliveries, sent on publish)
//   BRIDGE_URL     the bridge (default http://127.0.0.1:3500), for publishing
//
// Payloads are JSON objects. {"poison": true} is refused with 400 (the bridge dead-letters it);
// {"forward_to": "S"} is published to stream S through the bridge (same key, payload
// {"from": <entry id>, "seq": <seq>}) before the entry is acknowledged; a failed publish
// answers 503, so the bridge delivers the entry again later. In a batch, the entries that
// were not handled are named in the 200 answer: {"failed": [{"id": …, "status": …}]}.
//
// Java has no JSON parser in its standard library: `Json` below is a small one (objects,
// arrays, strings, numbers, true, false, null), enough for CloudEvents and these payloads.

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.URLDecoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;

public class App {
    static final String RECORD = System.getenv("APP_RECORD");
    static final long HANDLE_MS = Long.parseLong(env("APP_HANDLE_MS", "0"));
    static final String TOKEN = env("APP_TOKEN", "");
    static final String BRIDGE = env("BRIDGE_URL", "http://127.0.0.1:3500");
    static final HttpClient CLIENT = HttpClient.newHttpClient();

    static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isBlank() ? dflt : v;
    }

    /** A JSON value: Map (object), List (array), String, Long or Double, Boolean, or null. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        /** Parses one JSON document; IllegalArgumentException when it is not one. */
        static Object parse(String text) {
            Json p = new Json(text);
            Object v = p.value();
            p.space();
            if (p.i != p.s.length()) {
                throw p.error("end of the document");
            }
            return v;
        }

        private IllegalArgumentException error(String expected) {
            return new IllegalArgumentException("JSON: expected " + expected + " at " + i);
        }

        private void space() {
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) {
                i++;
            }
        }

        private boolean eat(char c) {
            space();
            if (i < s.length() && s.charAt(i) == c) {
                i++;
                return true;
            }
            return false;
        }

        private Object value() {
            space();
            if (i >= s.length()) {
                throw error("a value");
            }
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                if (eat('}')) {
                    return m;
                }
                do {
                    space();
                    if (i >= s.length() || s.charAt(i) != '"') {
                        throw error("a key");
                    }
                    String k = string();
                    if (!eat(':')) {
                        throw error("':'");
                    }
                    m.put(k, value());
                } while (eat(','));
                if (!eat('}')) {
                    throw error("'}'");
                }
                return m;
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                if (eat(']')) {
                    return l;
                }
                do {
                    l.add(value());
                } while (eat(','));
                if (!eat(']')) {
                    throw error("']'");
                }
                return l;
            }
            if (c == '"') {
                return string();
            }
            for (String word : new String[] {"true", "false", "null"}) {
                if (s.startsWith(word, i)) {
                    i += word.length();
                    return word.equals("null") ? null : Boolean.valueOf(word.equals("true"));
                }
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
                i++;
            }
            String n = s.substring(start, i);
            try {
                return n.matches("-?\\d+") ? (Object) Long.valueOf(n) : (Object) Double.valueOf(n);
            } catch (NumberFormatException e) {
                throw error("a value");
            }
        }

        private String string() {
            i++; // the opening quote
            StringBuilder b = new StringBuilder();
            while (i < s.length()) {
                char c = s.charAt(i++);
                if (c == '"') {
                    return b.toString();
                }
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (i >= s.length()) {
                    break;
                }
                char e = s.charAt(i++);
                switch (e) {
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'n' -> b.append('\n');
                    case 'r' -> b.append('\r');
                    case 't' -> b.append('\t');
                    case 'u' -> {
                        if (i + 4 > s.length()) {
                            throw error("four hex digits");
                        }
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                    }
                    default -> b.append(e); // \" \\ \/
                }
            }
            throw error("a closing quote");
        }

        /** `v` as JSON text. */
        static String write(Object v) {
            if (v == null) {
                return "null";
            }
            if (v instanceof String str) {
                StringBuilder b = new StringBuilder("\"");
                for (char c : str.toCharArray()) {
                    if (c == '"' || c == '\\') {
                        b.append('\\').append(c);
                    } else if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
                return b.append('"').toString();
            }
            if (v instanceof Map<?, ?> m) {
                List<String> parts = new ArrayList<>();
                m.forEach((k, x) -> parts.add(write(String.valueOf(k)) + ":" + write(x)));
                return "{" + String.join(",", parts) + "}";
            }
            if (v instanceof List<?> l) {
                List<String> parts = new ArrayList<>();
                l.forEach(x -> parts.add(write(x)));
                return "[" + String.join(",", parts) + "]";
            }
            return v.toString(); // Long, Double, Boolean
        }
    }

    /** One entry as the bridge delivered it, whatever the mode. */
    record Event(String id, Object shard, String key, Object deliveryCount, Object attempt, Map<String, Object> data,
                 String mode) {
    }

    /** A `ce-*` header value, percent-decoded (the HTTP binding's encoding; `+` is itself). */
    static String ce(HttpExchange ex, String name) {
        String v = ex.getRequestHeaders().getFirst(name);
        return v == null ? null : URLDecoder.decode(v.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    /** A number attribute as a Long when it is one (`rscshard` is text in structured mode). */
    static Object number(Object v) {
        if (v == null) {
            return null;
        }
        try {
            return Long.valueOf(v.toString());
        } catch (NumberFormatException e) {
            return v.toString();
        }
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> object(Object v) {
        return v instanceof Map<?, ?> ? (Map<String, Object>) v : new LinkedHashMap<>();
    }

    /** A structured-mode event (alone, or an element of a batch). */
    static Event fromStructured(Map<String, Object> o, String mode) {
        Object data = o.get("data");
        if (data == null && o.get("data_base64") instanceof String b64) {
            try {
                data = Json.parse(new String(Base64.getDecoder().decode(b64), StandardCharsets.UTF_8));
            } catch (IllegalArgumentException e) {
                data = null;
            }
        }
        Object subject = o.get("subject");
        return new Event((String) o.get("id"), number(o.get("rscshard")), subject == null ? null : subject.toString(),
            number(o.get("rscdeliverycount")), number(o.get("rscattempt")), object(data), mode);
    }

    /** A binary-mode event: the attributes in `ce-*` headers, the payload as the body. */
    static Event fromBinary(HttpExchange ex, Object body) {
        return new Event(ce(ex, "ce-id"), number(ce(ex, "ce-rscshard")), ce(ex, "ce-subject"),
            number(ce(ex, "ce-rscdeliverycount")), number(ce(ex, "ce-rscattempt")), object(body), "binary");
    }

    /** Publishes `rec` to `stream` through the bridge; false when it did not answer 200. */
    static boolean publish(String stream, Map<String, Object> rec) throws InterruptedException {
        HttpRequest.Builder req = HttpRequest.newBuilder(URI.create(BRIDGE + "/v1/publish/" + stream))
            .header("content-type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(Json.write(rec)));
        if (!TOKEN.isEmpty()) {
            req.header("Authorization", "Bearer " + TOKEN);
        }
        try {
            HttpResponse<String> r = CLIENT.send(req.build(), HttpResponse.BodyHandlers.ofString());
            if (r.statusCode() != 200) {
                System.err.println("publish failed: " + r.statusCode() + " " + r.body());
                return false;
            }
            return true;
        } catch (IOException e) {
            System.err.println("publish failed: " + e);
            return false;
        }
    }

    /** Handles one event; the HTTP status it would be answered alone. */
    static int handle(Event ev, long started) throws Exception {
        Map<String, Object> data = ev.data();
        if (Boolean.TRUE.equals(data.get("poison"))) {
            return 400;
        }
        if (HANDLE_MS > 0) {
            Thread.sleep(HANDLE_MS);
        }
        if (data.get("forward_to") instanceof String stream) {
            Map<String, Object> payload = new LinkedHashMap<>();
            payload.put("from", ev.id());
            payload.put("seq", data.get("seq"));
            Map<String, Object> rec = new LinkedHashMap<>();
            rec.put("key", ev.key());
            rec.put("payload", payload);
            if (!publish(stream, rec)) {
                return 503;
            }
        }
        if (RECORD != null) {
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("entry_id", ev.id());
            line.put("shard", ev.shard());
            line.put("key", ev.key());
            line.put("seq", data.get("seq"));
            line.put("delivery_count", ev.deliveryCount());
            line.put("attempt", ev.attempt());
            line.put("started_ms", started);
            line.put("finished_ms", System.currentTimeMillis());
            line.put("app", "java");
            line.put("mode", ev.mode());
            synchronized (App.class) {
                Files.writeString(Path.of(RECORD), Json.write(line) + "\n", StandardOpenOption.CREATE,
                    StandardOpenOption.APPEND);
            }
        }
        return 200;
    }

    static void answer(HttpExchange ex, int status, String json) throws IOException {
        if (json == null) {
            ex.sendResponseHeaders(status, -1);
        } else {
            byte[] bytes = json.getBytes(StandardCharsets.UTF_8);
            ex.getResponseHeaders().set("content-type", "application/json");
            ex.sendResponseHeaders(status, bytes.length);
            try (OutputStream out = ex.getResponseBody()) {
                out.write(bytes);
            }
        }
        ex.close();
    }

    /** One delivery: a binary or structured event, or a batch (a JSON array of structured events). */
    static void deliver(HttpExchange ex) throws Exception {
        long started = System.currentTimeMillis();
        String body = new String(ex.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
        if (!TOKEN.isEmpty() && !("Bearer " + TOKEN).equals(ex.getRequestHeaders().getFirst("Authorization"))) {
            answer(ex, 401, null);
            return;
        }
        String type = ex.getRequestHeaders().getFirst("Content-Type");
        type = type == null ? "" : type.split(";")[0].trim().toLowerCase();
        Object doc;
        try {
            doc = Json.parse(body);
        } catch (IllegalArgumentException e) {
            answer(ex, 400, null); // not JSON: retrying cannot fix it
            return;
        }
        if (type.equals("application/cloudevents-batch+json") && doc instanceof List<?> events) {
            List<Object> failed = new ArrayList<>();
            for (Object o : events) {
                Event ev = fromStructured(object(o), "batch");
                int status = handle(ev, started);
                if (status != 200) {
                    Map<String, Object> f = new LinkedHashMap<>();
                    f.put("id", ev.id());
                    f.put("status", (long) status);
                    failed.add(f);
                }
            }
            answer(ex, 200, Json.write(Map.of("failed", failed)));
            return;
        }
        Event ev = type.equals("application/cloudevents+json") ? fromStructured(object(doc), "structured")
            : fromBinary(ex, doc);
        answer(ex, handle(ev, started), null);
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(env("APP_PORT", "8080"));
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 64);
        server.createContext("/", ex -> {
            try {
                deliver(ex);
            } catch (Exception e) {
                e.printStackTrace();
                answer(ex, 500, null);
            }
        });
        server.setExecutor(Executors.newFixedThreadPool(16));
        server.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> server.stop(0)));
        System.out.println("listening on " + server.getAddress().getPort());
    }
}
